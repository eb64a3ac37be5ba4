//! `turbospark plot`: pictures of what `bench` and `--router-hist` wrote,
//! as SVG, drawn with `plotters`.
//!
//! - `plot router-hist FILE.json --out FILE.svg`: a heatmap, one row per
//!   MoE layer and one column per expert, each cell shaded by the expert's
//!   share of its layer's selections (white: never chosen; darkest: the
//!   layer's most chosen), from the JSON of `--router-hist`
//!   (`{num_experts, top_k, layers: [{layer, counts}]}`).
//! - `plot sweep FILE.jsonl --out FILE.svg`: cache hit rate and decode
//!   tok/s against the number of expert slots, from `bench --sweep --json`
//!   (one object per configuration; the streamed ones have `slots`).
//!
//! Only SVG: plotters' bitmap backend needs a font rasterizer and an image
//! encoder, more to build than a picture is worth here; any SVG viewer or
//! converter (`rsvg-convert`, a browser) makes a PNG.

use anyhow::{Context, Result};
use plotters::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(clap::Subcommand, Debug)]
pub enum What {
    /// A per-layer × per-expert heatmap of a router histogram
    /// (`--router-hist FILE.json`).
    RouterHist {
        /// The histogram JSON.
        input: PathBuf,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Hit rate and decode tok/s against slot count, from `bench --sweep
    /// --json` output (one JSON object per line).
    Sweep {
        /// The sweep's JSON lines.
        input: PathBuf,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
    },
}

/// What is wrong with a plot's input.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}, line {line}: not JSON")]
    Json {
        path: PathBuf,
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {field}: expected {expected}")]
    Field {
        path: PathBuf,
        field: String,
        expected: &'static str,
    },
    #[error("{path}: {what}")]
    Empty { path: PathBuf, what: &'static str },
    #[error("drawing {path}: {detail}")]
    Draw { path: PathBuf, detail: String },
}

/// A router histogram: `counts[layer row][expert]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterHist {
    pub num_experts: usize,
    pub layers: Vec<(usize, Vec<u64>)>,
}

fn field_err(path: &Path, field: impl Into<String>, expected: &'static str) -> PlotError {
    PlotError::Field {
        path: path.to_path_buf(),
        field: field.into(),
        expected,
    }
}

fn read(path: &Path) -> Result<String, PlotError> {
    std::fs::read_to_string(path).map_err(|source| PlotError::Read {
        path: path.to_path_buf(),
        source,
    })
}

impl RouterHist {
    /// Parses the JSON `--router-hist` writes.
    pub fn parse(path: &Path, text: &str) -> Result<RouterHist, PlotError> {
        let v: Value = serde_json::from_str(text).map_err(|source| PlotError::Json {
            path: path.to_path_buf(),
            line: 1,
            source,
        })?;
        let num_experts = v["num_experts"]
            .as_u64()
            .filter(|&n| n > 0)
            .ok_or_else(|| field_err(path, "num_experts", "a positive integer"))?
            as usize;
        let layers = v["layers"]
            .as_array()
            .ok_or_else(|| field_err(path, "layers", "an array"))?;
        let mut out = Vec::with_capacity(layers.len());
        for (i, l) in layers.iter().enumerate() {
            let layer = l["layer"]
                .as_u64()
                .ok_or_else(|| field_err(path, format!("layers[{i}].layer"), "an integer"))?;
            let counts = l["counts"]
                .as_array()
                .filter(|c| c.len() == num_experts)
                .ok_or_else(|| {
                    field_err(
                        path,
                        format!("layers[{i}].counts"),
                        "an array of num_experts counts",
                    )
                })?
                .iter()
                .map(|c| c.as_u64())
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| {
                    field_err(path, format!("layers[{i}].counts"), "non-negative integers")
                })?;
            out.push((layer as usize, counts));
        }
        if out.is_empty() {
            return Err(PlotError::Empty {
                path: path.to_path_buf(),
                what: "the histogram has no layers",
            });
        }
        Ok(RouterHist {
            num_experts,
            layers: out,
        })
    }
}

/// One streamed configuration of a sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepPoint {
    pub slots: u64,
    pub hit_rate: f64,
    pub decode_tps: f64,
}

/// The streamed configurations of `bench --sweep --json` output, by slot
/// count (resident and mapped lines, without `slots`, are left out).
pub fn parse_sweep(path: &Path, text: &str) -> Result<Vec<SweepPoint>, PlotError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|source| PlotError::Json {
            path: path.to_path_buf(),
            line: i + 1,
            source,
        })?;
        if v["test"] != "sweep" {
            continue;
        }
        let Some(slots) = v["slots"].as_u64() else {
            continue;
        };
        let num = |f: &str| {
            v[f].as_f64()
                .ok_or_else(|| field_err(path, format!("line {}: {f}", i + 1), "a number"))
        };
        out.push(SweepPoint {
            slots,
            hit_rate: num("hit_rate")?,
            decode_tps: num("decode_tok_per_s")?,
        });
    }
    if out.is_empty() {
        return Err(PlotError::Empty {
            path: path.to_path_buf(),
            what: "no streamed configurations (lines of `bench --sweep --json` with `slots`)",
        });
    }
    out.sort_by_key(|p| p.slots);
    Ok(out)
}

fn draw_err<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> PlotError + '_ {
    move |e| PlotError::Draw {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// Cell shade: white at 0, dark blue at the layer's maximum.
fn shade(share: f64) -> RGBColor {
    let s = share.clamp(0.0, 1.0);
    let mix = |hi: f64, lo: f64| (hi + (lo - hi) * s).round() as u8;
    RGBColor(mix(255.0, 8.0), mix(255.0, 48.0), mix(255.0, 107.0))
}

/// Draws `h` as a heatmap SVG at `out`: one rectangle per (layer, expert).
pub fn heatmap(h: &RouterHist, out: &Path) -> Result<(), PlotError> {
    let (rows, cols) = (h.layers.len(), h.num_experts);
    let cell = (900 / cols.max(1)).clamp(4, 24) as u32;
    let width = 140 + cell * cols as u32;
    let height = 110 + cell * rows as u32;
    let root = SVGBackend::new(out, (width, height)).into_drawing_area();
    let e = draw_err(out);
    root.fill(&WHITE).map_err(&e)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("router selections per layer and expert", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0..cols, 0..rows)
        .map_err(&e)?;
    let labels: Vec<usize> = h.layers.iter().map(|(l, _)| *l).collect();
    chart
        .configure_mesh()
        .disable_mesh()
        .x_desc("expert")
        .y_desc("layer")
        .x_labels(cols.min(16))
        .y_labels(rows.min(24))
        .y_label_formatter(&|r| labels.get(*r).map_or(String::new(), |l| l.to_string()))
        .draw()
        .map_err(&e)?;
    let cells = h.layers.iter().enumerate().flat_map(|(r, (_, counts))| {
        let max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
        counts.iter().enumerate().map(move |(c, &n)| {
            Rectangle::new([(c, r), (c + 1, r + 1)], shade(n as f64 / max).filled())
        })
    });
    chart.draw_series(cells).map_err(&e)?;
    root.present().map_err(&e)?;
    Ok(())
}

/// Draws hit rate (%) and decode tok/s against slot count at `out`, two
/// panels side by side, a marker per configuration.
pub fn sweep_chart(points: &[SweepPoint], out: &Path) -> Result<(), PlotError> {
    let root = SVGBackend::new(out, (960, 400)).into_drawing_area();
    let e = draw_err(out);
    root.fill(&WHITE).map_err(&e)?;
    let panels = root.split_evenly((1, 2));
    let max_slots = points.iter().map(|p| p.slots).max().unwrap_or(1).max(1);
    fn hit_pct(p: &SweepPoint) -> f64 {
        100.0 * p.hit_rate
    }
    fn tps(p: &SweepPoint) -> f64 {
        p.decode_tps
    }
    type Panel = (&'static str, &'static str, fn(&SweepPoint) -> f64);
    let series: [Panel; 2] = [
        ("expert cache hit rate", "hit rate %", hit_pct),
        ("decode speed", "tok/s", tps),
    ];
    for (area, (title, unit, y)) in panels.iter().zip(series) {
        let top = points.iter().map(&y).fold(0.0f64, f64::max);
        let top = if top > 0.0 { top * 1.1 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(35)
            .y_label_area_size(50)
            .build_cartesian_2d(0u64..max_slots + 1, 0.0..top)
            .map_err(&e)?;
        chart
            .configure_mesh()
            .x_desc("expert slots per layer")
            .y_desc(unit)
            .draw()
            .map_err(&e)?;
        let xy: Vec<(u64, f64)> = points.iter().map(|p| (p.slots, y(p))).collect();
        chart
            .draw_series(LineSeries::new(xy.clone(), BLUE.stroke_width(2)))
            .map_err(&e)?;
        chart
            .draw_series(xy.into_iter().map(|c| Circle::new(c, 4, BLUE.filled())))
            .map_err(&e)?;
    }
    root.present().map_err(&e)?;
    Ok(())
}

pub fn run(a: Args) -> Result<ExitCode> {
    match a.what {
        What::RouterHist { input, out } => {
            let h = RouterHist::parse(&input, &read(&input)?)?;
            heatmap(&h, &out).context("plot router-hist")?;
            eprintln!(
                "{}: {} layers × {} experts",
                out.display(),
                h.layers.len(),
                h.num_experts
            );
        }
        What::Sweep { input, out } => {
            let points = parse_sweep(&input, &read(&input)?)?;
            sweep_chart(&points, &out).context("plot sweep")?;
            eprintln!("{}: {} slot counts", out.display(), points.len());
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ts-plot-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Filled rectangles drawn in the plot area (the background and the
    /// chart frame are not filled with a shade of blue).
    fn count(svg: &str, tag: &str) -> usize {
        svg.matches(tag).count()
    }

    #[test]
    fn heatmap_has_a_cell_per_layer_and_expert() {
        let json = r#"{"num_experts": 4, "top_k": 2, "total": 12,
            "layers": [{"layer": 0, "total": 6, "counts": [3, 0, 2, 1]},
                       {"layer": 2, "total": 6, "counts": [0, 0, 6, 0]}]}"#;
        let h = RouterHist::parse(Path::new("h.json"), json).unwrap();
        assert_eq!(h.layers[1], (2, vec![0, 0, 6, 0]));
        let out = tmp("heat").join("h.svg");
        heatmap(&h, &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Background + 8 cells, every element closed.
        assert_eq!(count(&svg, "<rect"), 1 + 8, "{svg}");
        // The darkest shade once per layer (its most chosen expert), white
        // for never-chosen experts (4 of them) besides the background.
        assert_eq!(count(&svg, r##"fill="#08306B""##), 2, "{svg}");
        assert_eq!(count(&svg, r##"fill="#FFFFFF""##), 1 + 4, "{svg}");
        assert!(svg.contains("\nexpert\n") && svg.contains("\nlayer\n"));
    }

    #[test]
    fn sweep_has_a_point_per_slot_count() {
        let lines = [
            r#"{"test":"sweep","experts":"resident","slots":null,"hit_rate":1.0,"decode_tok_per_s":50.0}"#,
            r#"{"test":"sweep","experts":"streamed","slots":8,"hit_rate":0.5,"decode_tok_per_s":20.0}"#,
            r#"{"test":"sweep","experts":"streamed","slots":4,"hit_rate":0.25,"decode_tok_per_s":10.0}"#,
            r#"{"test":"sweep","experts":"streamed","slots":32,"hit_rate":1.0,"decode_tok_per_s":45.0}"#,
            r#"{"test":"tg128","tok_per_s":3.0}"#,
        ]
        .join("\n");
        let p = parse_sweep(Path::new("s.jsonl"), &lines).unwrap();
        assert_eq!(p.iter().map(|p| p.slots).collect::<Vec<_>>(), [4, 8, 32]);
        let out = tmp("sweep").join("s.svg");
        sweep_chart(&p, &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        // Three markers in each of the two panels, one line per panel.
        assert_eq!(count(&svg, "<circle"), 6, "{svg}");
        assert_eq!(
            count(
                &svg,
                r##"<polyline fill="none" opacity="1" stroke="#0000FF""##
            ),
            2,
            "{svg}"
        );
        assert!(svg.contains("\ndecode speed\n") && svg.contains("\nexpert cache hit rate\n"));
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let p = Path::new("x.json");
        assert!(matches!(
            RouterHist::parse(p, "{not json"),
            Err(PlotError::Json { line: 1, .. })
        ));
        assert!(matches!(
            RouterHist::parse(p, r#"{"num_experts": 2, "layers": [{"layer": 0, "counts": [1]}]}"#),
            Err(PlotError::Field { ref field, .. }) if field == "layers[0].counts"
        ));
        assert!(matches!(
            RouterHist::parse(p, r#"{"layers": []}"#),
            Err(PlotError::Field { ref field, .. }) if field == "num_experts"
        ));
        assert!(matches!(
            RouterHist::parse(p, r#"{"num_experts": 2, "layers": []}"#),
            Err(PlotError::Empty { .. })
        ));
        assert!(matches!(
            parse_sweep(p, "{\"test\":\"sweep\",\"slots\":4}\n{oops"),
            Err(PlotError::Field { .. })
        ));
        assert!(matches!(
            parse_sweep(p, "{\"test\":\"sweep\"}\n{oops"),
            Err(PlotError::Json { line: 2, .. })
        ));
        assert!(matches!(
            parse_sweep(p, r#"{"test":"tg128","tok_per_s":3.0}"#),
            Err(PlotError::Empty { .. })
        ));
        assert!(matches!(
            read(Path::new("/nonexistent/x.json")),
            Err(PlotError::Read { .. })
        ));
    }
}
