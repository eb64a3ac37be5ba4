//! The FFN census against a host reference computed from the weights.
//!
//! A one-layer model whose attention output matrix is zero has, at every
//! position, the FFN input `a = ffn_norm(embedding(token))`: no attention
//! arithmetic to reproduce. The test computes the GLU intermediate from
//! the weights in f64 (dense: `silu(Wg·a) ⊙ Wu·a`; MoE: routing with
//! `route_token` on the host, then each chosen expert's intermediate) and
//! the census from it, and compares: counts below each threshold exactly
//! (but for values within rounding of a threshold), sums of `|a|` per
//! neuron to 1e-5, rows per expert exactly (and against the router
//! histogram). With streamed experts (slot caches of top_k, a middle
//! count and every expert) the census meets the same reference and equals
//! the resident one bit for bit.

mod common;

use serde_json::json;
use turbospark_backend::{HostTensor, Route, RouterScratch, RouterSpec, RouterTables};
use turbospark_core::arch::NormScale;
use turbospark_core::{ArchSpec, QuantFormat};
use turbospark_cpu::{CpuDevice, Numerics};
use turbospark_engine::synthetic::SyntheticSource;
use turbospark_engine::synthetic_install::{write_synthetic_install, SynthOptions};
use turbospark_engine::{
    EngineError, ExpertMode, ExpertOptions, FfnSite, InstallSource, Model, SessionOptions,
    SiteCensus, WeightSource,
};
use turbospark_format::install::Install;

/// [`SyntheticSource`] with a zero attention output matrix.
struct NoAttention(SyntheticSource);

impl WeightSource for NoAttention {
    fn resident(&self, name: &str) -> Result<HostTensor, EngineError> {
        let mut t = self.0.resident(name)?;
        if name.ends_with("attn_output.weight") {
            assert_eq!(t.format, QuantFormat::F32);
            let n: usize = t.shape.iter().product();
            t.bytes = turbospark_backend::SharedBytes::from_f32(&vec![0.0; n]);
        }
        Ok(t)
    }
    fn expert_part(&self, l: usize, e: usize, part: &str) -> Result<HostTensor, EngineError> {
        self.0.expert_part(l, e, part)
    }
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    assert_eq!(t.format, QuantFormat::F32, "{}", t.name);
    t.bytes
        .as_slice()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `W·x` for `W` `[rows, x.len()]`, in f64.
fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|r| r.iter().zip(x).map(|(&a, &b)| f64::from(a) * b).sum())
        .collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// The FFN input of `token` in the one-layer model.
fn ffn_input(spec: &ArchSpec, src: &dyn WeightSource, token: u32) -> Vec<f64> {
    let h = spec.hidden_size;
    let embd = f32s(&src.resident("token_embd.weight").unwrap());
    let x: Vec<f64> = embd[token as usize * h..(token as usize + 1) * h]
        .iter()
        .map(|&v| f64::from(v) * f64::from(spec.embedding.scale))
        .collect();
    let ns = spec.norms.ffn_input;
    assert_eq!(ns.scale, NormScale::Plain);
    let w = f32s(&src.resident("blk.0.ffn_norm.weight").unwrap());
    let ms = x.iter().map(|v| v * v).sum::<f64>() / h as f64;
    let r = 1.0 / (ms + f64::from(ns.eps)).sqrt();
    x.iter()
        .zip(&w)
        .map(|(v, &w)| v * r * f64::from(w))
        .collect()
}

/// The census of reference rows, with how many values lie so close to a
/// threshold that f32 rounding may put them on either side.
struct Reference {
    rows: Vec<u64>,
    below: Vec<u64>,
    near: Vec<u64>,
    sum_abs: Vec<f64>,
}

impl Reference {
    fn new(groups: usize, width: usize, thresholds: &[f32]) -> Self {
        Reference {
            rows: vec![0; groups],
            below: vec![0; thresholds.len()],
            near: vec![0; thresholds.len()],
            sum_abs: vec![0.0; groups * width],
        }
    }

    fn count(&mut self, thresholds: &[f32], group: usize, row: &[f64]) {
        let w = row.len();
        self.rows[group] += 1;
        for (i, &v) in row.iter().enumerate() {
            self.sum_abs[group * w + i] += v.abs();
            for (j, &th) in thresholds.iter().enumerate() {
                let th = f64::from(th);
                self.below[j] += u64::from(v.abs() < th);
                self.near[j] += u64::from((v.abs() - th).abs() <= 1e-5 * th);
            }
        }
    }

    fn check(&self, got: &SiteCensus) {
        assert_eq!(got.rows, self.rows);
        for j in 0..self.below.len() {
            let d = got.below[j].abs_diff(self.below[j]);
            assert!(
                d <= self.near[j],
                "threshold {j}: {} below, reference {} (±{})",
                got.below[j],
                self.below[j],
                self.near[j]
            );
        }
        // Shares are monotone in the threshold.
        let shares = got.share_below();
        assert!(shares.windows(2).all(|w| w[0] <= w[1]), "{shares:?}");
        let scale = self.sum_abs.iter().fold(0f64, |m, &v| m.max(v));
        for (i, (&g, &r)) in got.sum_abs.iter().zip(&self.sum_abs).enumerate() {
            assert!(
                (g - r).abs() <= 1e-5 * scale,
                "neuron {i}: Σ|a| {g}, reference {r}"
            );
        }
    }
}

const THRESHOLDS: [f32; 3] = [1e-3, 1e-2, 1e-1];

fn one_layer(family: &str) -> (ArchSpec, NoAttention) {
    let spec = common::spec(family, &[("num_hidden_layers", json!(1))]).unwrap();
    let src = NoAttention(SyntheticSource::new(&spec, 7, QuantFormat::F32).unwrap());
    (spec, src)
}

#[test]
fn dense_census_matches_the_weights() {
    let (spec, src) = one_layer("llama");
    let model = Model::from_source(
        spec.clone(),
        &src,
        CpuDevice::new(2).unwrap().with_numerics(Numerics::Exact),
    )
    .unwrap();
    let tokens = common::tokens(20, spec.vocab_size);
    let mut s = model.session(SessionOptions::new(32)).unwrap();
    assert!(s.ffn_census().is_none());
    s.set_ffn_census(Some(&THRESHOLDS)).unwrap();
    // Prefill and a decode step count alike.
    let mut logits = vec![0.0; tokens.len() * spec.vocab_size];
    s.prefill(&tokens[..19], &mut logits[..19 * spec.vocab_size])
        .unwrap();
    s.decode(tokens[19], 19).unwrap();

    let gate = f32s(&src.resident("blk.0.ffn_gate.weight").unwrap());
    let up = f32s(&src.resident("blk.0.ffn_up.weight").unwrap());
    let width = spec.intermediate_size;
    let mut r = Reference::new(1, width, &THRESHOLDS);
    for &t in &tokens {
        let a = ffn_input(&spec, &src, t);
        let row: Vec<f64> = matvec(&gate, &a)
            .into_iter()
            .zip(matvec(&up, &a))
            .map(|(g, u)| silu(g) * u)
            .collect();
        r.count(&THRESHOLDS, 0, &row);
    }
    let census = s.ffn_census().unwrap();
    assert_eq!(census.sites.len(), 1);
    let site = census.site(0, FfnSite::Dense).unwrap();
    assert_eq!(site.values(), 20 * width as u64);
    r.check(site);
    // The top neuron is the reference's largest mean.
    let top = site.top(3);
    let best = (0..width)
        .max_by(|&a, &b| r.sum_abs[a].total_cmp(&r.sum_abs[b]))
        .unwrap();
    assert_eq!(top[0].neuron, best);
    assert!(top.windows(2).all(|w| w[0].mean_abs >= w[1].mean_abs));

    // Stopping the census stops counting.
    s.set_ffn_census(None).unwrap();
    assert!(s.ffn_census().is_none());
}

/// The routed experts' census of `tokens` in the one-layer model of
/// `src` (attention output zero): routing with `route_token` on the host,
/// then each chosen expert's intermediate, in f64.
fn routed_reference(spec: &ArchSpec, src: &dyn WeightSource, tokens: &[u32]) -> Reference {
    let moe = spec.moe.unwrap();
    let router = f32s(&src.resident("blk.0.ffn_gate_inp.weight").unwrap());
    let rspec = RouterSpec::of(&moe).unwrap();
    let mut scratch = RouterScratch::new(moe.num_experts);
    let width = moe.expert_intermediate;
    let experts: Vec<(Vec<f32>, Vec<f32>)> = (0..moe.num_experts)
        .map(|e| {
            (
                f32s(&src.expert_part(0, e, "gate").unwrap()),
                f32s(&src.expert_part(0, e, "up").unwrap()),
            )
        })
        .collect();
    let mut r = Reference::new(moe.num_experts, width, &THRESHOLDS);
    for &t in tokens {
        let a = ffn_input(spec, src, t);
        let a32: Vec<f32> = matvec(&router, &a).iter().map(|&v| v as f32).collect();
        let mut routes = vec![Route::default(); moe.top_k];
        let none = RouterTables {
            correction: None,
            expert_scale: None,
        };
        turbospark_backend::routing::route_token(&rspec, &mut scratch, &a32, none, &mut routes)
            .unwrap();
        for route in routes {
            let (g, u) = &experts[route.slot as usize];
            let row: Vec<f64> = matvec(g, &a)
                .into_iter()
                .zip(matvec(u, &a))
                .map(|(g, u)| silu(g) * u)
                .collect();
            r.count(&THRESHOLDS, route.slot as usize, &row);
        }
    }
    r
}

#[test]
fn routed_census_matches_the_weights_and_the_router() {
    let (spec, src) = one_layer("mixtral");
    let moe = spec.moe.unwrap();
    let model = Model::from_source(
        spec.clone(),
        &src,
        CpuDevice::new(2).unwrap().with_numerics(Numerics::Exact),
    )
    .unwrap();
    let tokens = common::tokens(24, spec.vocab_size);
    let mut s = model.session(SessionOptions::new(32)).unwrap();
    s.set_route_statistics(true);
    s.set_ffn_census(Some(&THRESHOLDS)).unwrap();
    let mut logits = vec![0.0; tokens.len() * spec.vocab_size];
    s.prefill(&tokens, &mut logits).unwrap();

    let r = routed_reference(&spec, &src, &tokens);
    let census = s.ffn_census().unwrap();
    let site = census.site(0, FfnSite::Experts).unwrap();
    assert_eq!(
        site.values(),
        (tokens.len() * moe.top_k * moe.expert_intermediate) as u64
    );
    r.check(site);
    // Rows per expert are the router histogram's counts.
    let hist = s.router_histogram();
    assert_eq!(hist.layers()[0].1, site.rows);
    // Every listed neuron belongs to an expert some token reached.
    for n in site.top(10) {
        assert!(site.rows[n.group] > 0);
    }
}

/// A one-layer mixtral install on disk whose attention output matrix is
/// zero, removed when dropped.
struct ZeroAttentionInstall(std::path::PathBuf);

impl ZeroAttentionInstall {
    fn write(spec: &ArchSpec) -> Self {
        use std::io::{Seek, SeekFrom, Write};
        let dir =
            std::env::temp_dir().join(format!("turbospark-census-streamed-{}", std::process::id()));
        let opts = SynthOptions {
            seed: 7,
            resident_format: QuantFormat::F32,
            expert_format: QuantFormat::F32,
            threads: 1,
            force: true,
            router_skew: None,
        };
        write_synthetic_install(spec, &dir, &opts, &mut |_| {}).unwrap();
        let install = Install::open(&dir).unwrap();
        let (t, _) = install.tensor("blk.0.attn_output.weight").unwrap();
        let (offset, len) = (t.offset, t.length as usize);
        let path = dir.join(&install.manifest.resident_file);
        drop(install);
        let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&vec![0u8; len]).unwrap();
        ZeroAttentionInstall(dir)
    }
}

impl Drop for ZeroAttentionInstall {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn streamed_census_matches_the_weights_and_resident_experts() {
    let (spec, _) = one_layer("mixtral");
    let moe = spec.moe.unwrap();
    let tmp = ZeroAttentionInstall::write(&spec);
    let install = Install::open(&tmp.0).unwrap();
    let src = InstallSource::new(&install).unwrap();
    let tokens = common::tokens(24, spec.vocab_size);
    let r = routed_reference(&spec, &src, &tokens);

    // Prefill in chunks of 8 (with top_k slots a chunk needs more experts
    // than there are slots, so it runs in token groups), then decode.
    let census = |opts: &ExpertOptions| -> SiteCensus {
        let device = CpuDevice::new(2).unwrap().with_numerics(Numerics::Exact);
        let model = Model::open(&install, device, opts).unwrap();
        let mut s = model
            .session(SessionOptions {
                context: 32,
                max_batch: 8,
            })
            .unwrap();
        s.set_ffn_census(Some(&THRESHOLDS)).unwrap();
        let mut logits = vec![0.0; 20 * spec.vocab_size];
        s.prefill(&tokens[..20], &mut logits).unwrap();
        for (i, &t) in tokens.iter().enumerate().skip(20) {
            s.decode(t, i).unwrap();
        }
        s.ffn_census()
            .unwrap()
            .site(0, FfnSite::Experts)
            .unwrap()
            .clone()
    };
    let resident = census(&ExpertOptions {
        mode: ExpertMode::Resident,
        ..ExpertOptions::default()
    });
    r.check(&resident);
    let (k, ne) = (moe.top_k, moe.num_experts);
    for slots in [k, (k + ne) / 2, ne] {
        let streamed = census(&ExpertOptions::streamed(slots));
        r.check(&streamed);
        // The same rows through the same arithmetic, counted in the same
        // order: equal to the last bit.
        assert_eq!(streamed, resident, "{slots} slots");
    }
}

#[test]
fn bad_thresholds_are_refused() {
    let (spec, src) = one_layer("llama");
    let model = Model::from_source(spec, &src, CpuDevice::new(1).unwrap()).unwrap();
    let mut s = model.session(SessionOptions::new(8)).unwrap();
    for bad in [&[][..], &[0.0][..], &[f32::NAN][..], &[-1e-2][..]] {
        assert!(matches!(
            s.set_ffn_census(Some(bad)),
            Err(EngineError::BadOptions { .. })
        ));
    }
}
