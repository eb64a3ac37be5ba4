//! `--ffn-census FILE.json`: the engine's FFN census
//! (`turbospark_engine::census`) as JSON.
//!
//! ```text
//! {"model", "numerics", "thresholds": [θ…],
//!  "sites": [{"layer", "site": dense|experts|shared_expert|parallel_dense,
//!             "width", "rows", "values", "mean_abs",
//!             "below": [count per θ], "share_below": [share per θ],
//!             "rows_per_expert": [...]            (routed experts only)
//!             "top": [{"expert"?, "neuron", "mean_abs"}…]}…]}
//! ```
//!
//! `rows` is tokens for a dense site and (token, rank) pairs for routed
//! experts, so `values = rows × width`; a routed neuron's mean is over the
//! rows routed to its expert.

use serde_json::{json, Value};
use std::path::Path;
use turbospark_engine::{FfnCensus, FfnSite};

/// The census as JSON, with the `top` neurons of each site.
pub fn census_json(c: &FfnCensus, top: usize, model: &Path, numerics: &str) -> Value {
    let sites: Vec<Value> = c
        .sites
        .iter()
        .map(|s| {
            let routed = s.site == FfnSite::Experts;
            let neurons: Vec<Value> = s
                .top(top)
                .iter()
                .map(|n| {
                    if routed {
                        json!({"expert": n.group, "neuron": n.neuron, "mean_abs": n.mean_abs})
                    } else {
                        json!({"neuron": n.neuron, "mean_abs": n.mean_abs})
                    }
                })
                .collect();
            let mut v = json!({
                "layer": s.layer,
                "site": s.site.name(),
                "width": s.width,
                "rows": s.rows.iter().sum::<u64>(),
                "values": s.values(),
                "mean_abs": s.mean_abs(),
                "below": s.below,
                "share_below": s.share_below(),
                "top": neurons,
            });
            if routed {
                v["rows_per_expert"] = json!(s.rows);
            }
            v
        })
        .collect();
    json!({
        "model": model.display().to_string(),
        "numerics": numerics,
        // As written on the command line, not widened from f32 (0.001,
        // not 0.0010000000474974513).
        "thresholds": c.thresholds.iter().map(|t| t.to_string().parse::<f64>().unwrap_or(f64::from(*t))).collect::<Vec<_>>(),
        "sites": sites,
    })
}
