//! Routing and routed experts on a [`CudaStream`] (HF `MixtralSparseMoeBlock`
//! / `GptOssMLP`): the router's top-k (`kernels/route.cu`, or joined to a
//! one-token Q8_0 router product), then every selected expert of a batch
//! in one launch per stage — 8-bit activations for Q8_0/MXFP4 banks and
//! (`kernels/kq.cu`) the K-quant and legacy 4/5-bit ones, the tensor cores
//! for the other formats in fast numerics, moe.cu's generic kernels
//! otherwise — and the weighted sum of the routes' outputs.

use super::{shape, CudaStream, Q8Regions};
use crate::fusion::{self, GroupLaunch, Pending};
use crate::kernels::{self, args, launch, BankView, MoeAct};
use crate::memory::DevMem;
use crate::types::{CudaBank, CudaBuf, CudaRoutes, CudaVector};
use crate::CudaDevice;
use turbospark_backend::{
    check_len, routes_for, BackendError, MoeInput, MoeScratch, Numerics, RouterSpec, RouterTables,
};
use turbospark_core::arch::{Activation, RouterKind};
use turbospark_core::QuantFormat;

/// A quantization of the MoE input made ahead (see
/// `CudaStream::routed_q8`): the f32 input `x` (`values` long) it was made
/// from, and its codes and scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RoutedQ8 {
    pub(super) x: u64,
    pub(super) values: usize,
    pub(super) xq: u64,
    pub(super) xd: u64,
}

pub(super) fn activation(act: Activation) -> MoeAct {
    match act {
        Activation::Swiglu => MoeAct {
            act: 0,
            alpha: 0.0,
            limit: 0.0,
        },
        Activation::GeluTanh => MoeAct {
            act: 1,
            alpha: 0.0,
            limit: 0.0,
        },
        Activation::ClampedSwiglu { alpha, limit } => MoeAct {
            act: 2,
            alpha,
            limit,
        },
    }
}

impl CudaStream {
    /// The pending one-token router product that `route` can join: a
    /// Q8_0 product of one matrix alone (with its bias) writing `logits`.
    fn fusable_router(&self, logits: u64, n_tokens: usize, experts: usize) -> Option<GroupLaunch> {
        match self.pending.get() {
            Some(Pending::Group(g))
                if self.fuse.router
                    && n_tokens == 1
                    && g.n == 1
                    && g.group.count == 1
                    && g.group.out[0] == logits
                    && g.group.rows[0] as usize == experts
                    && g.format == QuantFormat::Q8_0
                    && g.cols <= kernels::ONE_MAX_COLS
                    && self.router_kernel().is_some() =>
            {
                Some(g)
            }
            _ => None,
        }
    }

    /// The pending one-token bf16 router product that `route` can join
    /// under `TURBOSPARK_CUDA_BF16=stream+route`: one matrix alone (with
    /// its bias) writing `logits`, rows that fit the streamed kernel.
    fn joinable_bf16_router(
        &self,
        logits: u64,
        n_tokens: usize,
        experts: usize,
    ) -> Option<(GroupLaunch, &cudarc::driver::CudaFunction)> {
        // (Set up only under the setting: kernels/tc.rs `TcSet`.)
        let joined = self
            .k
            .tc
            .as_ref()?
            .get(QuantFormat::Bf16)?
            .router_streamed
            .as_ref()?;
        match self.pending.get() {
            Some(Pending::Group(g))
                if n_tokens == 1
                    && g.n == 1
                    && g.group.count == 1
                    && g.group.out[0] == logits
                    && g.group.rows[0] as usize == experts
                    && g.format == QuantFormat::Bf16
                    && !g.q8
                    && joined.fits(g.cols) =>
            {
                Some((g, &joined.f))
            }
            _ => None,
        }
    }

    /// The bf16 router product `g` (pending) and the routing of its logits
    /// in one launch of one block (`router_tc1s_bf16`).
    fn route_bf16_joined(
        &self,
        (g, f): (GroupLaunch, &cudarc::driver::CudaFunction),
        p: kernels::RouterParams,
        correction: u64,
        expert_scale: u64,
        out: u64,
    ) -> Result<(), BackendError> {
        // The product and the routing write only the logits and the
        // routes: a quantization of the MoE input made before stays valid.
        let routed = self.routed_q8.get();
        self.bind_holding("route")?;
        self.pending.set(None);
        self.quantized.set(None);
        let tiles = g.group.tiles(16) as i32;
        let group = g.group.in_blocks_of(16);
        let cols = g.cols as i32;
        let args = &mut args![group, cols, g.x, tiles, p, correction, expert_scale, out];
        let (threads, smem) = kernels::TcStreamed::block(g.cols);
        launch("route", f, self.raw(), (1, 1, 1), threads, smem, args)?;
        self.routed_q8.set(routed);
        Ok(())
    }

    fn router_kernel(&self) -> Option<&kernels::OneKernel> {
        self.k
            .q8
            .get(QuantFormat::Q8_0)?
            .one
            .as_ref()?
            .router
            .as_ref()
    }

    /// The router product `g` (pending) and the routing of its logits in
    /// one launch (`router1_q8x_q8_0`), which also quantizes the product's
    /// input in MXFP4's order for the MoE call that follows when its width
    /// fits `routed_x`, the norm before the product has not done so, and
    /// the gate/up products do not start early ([`Self::early_gate_up`]).
    fn route_fused(
        &mut self,
        g: GroupLaunch,
        p: kernels::RouterParams,
        correction: u64,
        expert_scale: u64,
        out: u64,
    ) -> Result<(), BackendError> {
        // The norm that wrote the product's input may have quantized it in
        // MXFP4's order already (`matmul_q8`): then the launch need not.
        let made = self
            .routed_q8
            .get()
            .filter(|m| m.x == g.x && m.values == g.cols);
        self.bind_holding("route")?;
        self.pending.set(None);
        self.quantized.set(None);
        let r = Q8Regions::new(g.cols, 0);
        // (Not when the gate/up products start early: they need the
        // experts' own quantization launch after the routing.)
        let premade = g.cols % 32 == 0 && r.bytes <= self.routed_x.bytes && !self.early_gate_up();
        let (mq, md) = if premade && made.is_none() {
            (self.routed_x.ptr, self.routed_x.ptr + r.xd)
        } else {
            (0, 0)
        };
        let one = self.router_kernel().expect("checked by fusable_router");
        let rows = kernels::OneWork::Rows(&g.group.rows[..1]);
        let l = one.config(QuantFormat::Q8_0, g.cols, rows)?;
        let (cols, ticket) = (g.cols as i32, self.ticket.ptr);
        let args = &mut args![
            g.group,
            cols,
            g.xq,
            g.xd,
            p,
            correction,
            expert_scale,
            out,
            ticket,
            g.x,
            mq,
            md
        ];
        launch("route", &one.f, self.raw(), l.grid, l.threads, l.smem, args)?;
        if made.is_some() {
            self.routed_q8.set(made);
        } else if premade {
            self.routed_q8.set(Some(RoutedQ8 {
                x: g.x,
                values: g.cols,
                xq: mq,
                xd: md,
            }));
        }
        Ok(())
    }

    /// The tensor-core expert kernels (`kernels/tcmoe.cu`) of `bank`'s
    /// gate/up and down formats, when its products take them: fast
    /// numerics, gate and up in one format with such kernels, down in one
    /// too, rows whole chunks of 32 columns both ways, every matrix and
    /// row stride aligned as its format's loads need, the input `x` and
    /// the activations `act` 16-byte aligned.
    fn tc_experts(
        &self,
        bank: &CudaBank,
        x: u64,
        act: u64,
    ) -> Option<(&kernels::TcExperts, &kernels::TcExperts)> {
        if self.numerics != Numerics::Fast || bank.gate.format != bank.up.format {
            return None;
        }
        let tc = self.k.tc.as_ref()?;
        let (gu, down) = (tc.get(bank.gate.format)?, tc.get(bank.down.format)?);
        let aligned =
            |m: &crate::types::Stacked| kernels::tc_aligned(m.format, m.mem.ptr, m.row_bytes);
        let fits = bank.hidden % kernels::TC_CHUNK == 0
            && bank.inter % kernels::TC_CHUNK == 0
            && [&bank.gate, &bank.up, &bank.down].into_iter().all(aligned)
            && x % 16 == 0
            && act % 16 == 0;
        fits.then_some((&gu.experts, &down.experts))
    }

    /// Whether one token's MXFP4 gate/up products start early (unless
    /// `TURBOSPARK_CUDA_GATE_UP=wait`, kernels/q8.rs `early_gate_up`):
    /// they then need a launch between the routing and them, the
    /// quantization of their input.
    pub(super) fn early_gate_up(&self) -> bool {
        self.q8_set(QuantFormat::Mxfp4)
            .is_some_and(|s| s.route.has_early())
    }

    /// The kernels of a bank whose experts take kq.cu's (fast numerics,
    /// not `TURBOSPARK_CUDA_KQ=tc`, gate and up of one format, every matrix
    /// in a format kq.cu has and fitting its kernels, [`kernels::kq_fits`]):
    /// the gate/up format's and the down format's.
    fn kq_experts(
        &self,
        bank: &CudaBank,
        x: u64,
        act: u64,
    ) -> Option<(&kernels::KqSet, &kernels::KqSet)> {
        if self.numerics != Numerics::Fast || bank.gate.format != bank.up.format {
            return None;
        }
        let kq = self.k.kq.as_ref()?;
        let (gu, down) = (kq.get(bank.gate.format)?, kq.get(bank.down.format)?);
        let fits = |m: &crate::types::Stacked, cols: usize, input: u64| {
            kernels::kq_fits(m.format, cols, m.mem.ptr, m.row_bytes, input)
        };
        let all = fits(&bank.gate, bank.hidden, x)
            && fits(&bank.up, bank.hidden, x)
            && fits(&bank.down, bank.inter, act);
        all.then_some((gu, down))
    }

    fn bank_view(bank: &CudaBank) -> BankView {
        let opt = |m: &Option<DevMem>| m.as_ref().map_or(0, |m| m.ptr);
        BankView {
            gate: bank.gate.mem.ptr,
            up: bank.up.mem.ptr,
            down: bank.down.mem.ptr,
            gate_bias: opt(&bank.gate_bias),
            up_bias: opt(&bank.up_bias),
            down_bias: opt(&bank.down_bias),
            gate_row_bytes: bank.gate.row_bytes as i64,
            up_row_bytes: bank.up.row_bytes as i64,
            down_row_bytes: bank.down.row_bytes as i64,
            hidden: bank.hidden as i32,
            inter: bank.inter as i32,
            slots: bank.slots as i32,
        }
    }

    pub(super) fn enqueue_route(
        &mut self,
        logits: &CudaBuf,
        n_tokens: usize,
        router: &RouterSpec,
        tables: RouterTables<'_, CudaVector>,
        out: &mut CudaRoutes,
    ) -> Result<(), BackendError> {
        let (e, k) = (router.num_experts(), router.top_k());
        let lp = logits.f32_ptr("route", "logits", n_tokens * e)?;
        if routes_for("route", out, n_tokens)? != k {
            return Err(shape(
                "route",
                format!("routes of {} per token for a top-{k} router", out.top_k),
            ));
        }
        for (what, t) in [
            ("correction", tables.correction),
            ("expert_scale", tables.expert_scale),
        ] {
            if let Some(t) = t {
                check_len("route", what, t.len, e)?;
            }
        }
        if e > kernels::MAX_ROUTE_EXPERTS
            || k > kernels::MAX_TOP_K
            || router.groups() > kernels::MAX_GROUPS
        {
            return Err(BackendError::Router {
                num_experts: e,
                top_k: k,
                problem: "more experts, ranks or groups than the CUDA router handles (512, 32, 64)",
            });
        }
        let mut p = kernels::RouterParams {
            kind: 0,
            num_experts: e as i32,
            top_k: k as i32,
            renormalize: 0,
            n_group: 0,
            topk_group: 0,
            scaling: 1.0,
        };
        match router.kind() {
            RouterKind::SoftmaxTopK { renormalize } => p.renormalize = renormalize as i32,
            RouterKind::TopKSoftmax => p.kind = 1,
            RouterKind::SigmoidGrouped {
                n_group,
                topk_group,
                renormalize,
                scaling,
            } => {
                p.kind = 2;
                p.n_group = n_group as i32;
                p.topk_group = topk_group as i32;
                p.renormalize = renormalize as i32;
                p.scaling = scaling;
            }
            RouterKind::Gemma4 => p.kind = 3,
        }
        let cp = tables.correction.map_or(0, |v| v.mem.ptr);
        let sp = tables.expert_scale.map_or(0, |v| v.mem.ptr);
        let n = n_tokens as i32;
        out.max_slot = (e - 1) as u32;
        if let Some(g) = self.fusable_router(lp, n_tokens, e) {
            return self.route_fused(g, p, cp, sp, out.mem.ptr);
        }
        if let Some(joined) = self.joinable_bf16_router(lp, n_tokens, e) {
            return self.route_bf16_joined(joined, p, cp, sp, out.mem.ptr);
        }
        // The routing writes only the routes: a quantization of the MoE
        // input made before it stays valid.
        let routed = self.routed_q8.get();
        self.bind("route")?;
        self.routed_q8.set(routed);
        launch(
            "route",
            &self.k.route,
            self.raw(),
            (n_tokens as u32, 1, 1),
            32,
            0,
            &mut args![lp, n, p, cp, sp, out.mem.ptr],
        )
    }

    pub(super) fn enqueue_moe_experts(
        &mut self,
        input: MoeInput<'_, CudaDevice>,
        scratch: &mut MoeScratch<CudaBuf>,
        only: Option<&[bool]>,
    ) -> Result<(), BackendError> {
        let MoeInput {
            x,
            n_tokens: n,
            routes,
            bank,
            activation: act,
        } = input;
        if n == 0 {
            return Ok(());
        }
        let k = routes_for("moe", routes, n)?;
        let (hidden, inter) = (bank.hidden, bank.inter);
        let xp = x.f32_ptr("moe", "x", n * hidden)?;
        let yp = scratch.y.f32_ptr("moe", "scratch.y", n * k * hidden)?;
        if self.act_len < n * k * inter {
            return Err(BackendError::ScratchTooSmall {
                op: "moe",
                need: n * k * inter,
                have: self.act_len,
            });
        }
        let mut mask = kernels::SlotMask {
            bits: [0; kernels::MAX_MASK_SLOTS / 32],
            on: 0,
        };
        if let Some(only) = only {
            check_len("moe", "only", only.len(), bank.slots)?;
            if bank.slots > kernels::MAX_MASK_SLOTS {
                return Err(shape(
                    "moe",
                    format!(
                        "a slot mask over {} slots (at most {})",
                        bank.slots,
                        kernels::MAX_MASK_SLOTS
                    ),
                ));
            }
            mask.on = 1;
            for (s, _) in only[..bank.slots].iter().enumerate().filter(|(_, &o)| o) {
                mask.bits[s / 32] |= 1 << (s % 32);
            }
        }
        if routes.max_slot as usize >= bank.slots {
            return Err(BackendError::BadRoute {
                slot: routes.max_slot as usize,
                available: bank.slots,
            });
        }
        let view = Self::bank_view(bank);
        let a = activation(act);
        let kk = k as i32;
        // The fused router launch's quantization of this very input (read
        // before `bind`, which forgets it).
        let premade = self.routed_q8.get().filter(|r| {
            r.x == xp && r.values == n * hidden && bank.gate.format == QuantFormat::Mxfp4
        });
        self.bind("moe")?;
        let threads = (kernels::MM_WARPS * 32) as u32;
        let passes: &[(turbospark_core::QuantFormat, i32)] = if bank.gate.format == bank.up.format {
            &[(bank.gate.format, 0)]
        } else {
            &[(bank.gate.format, 1), (bank.up.format, 2)]
        };
        let grouped =
            n > 1 && bank.slots <= kernels::MAX_MASK_SLOTS && self.order.bytes >= n * k * 4;
        let fast = bank.gate.format == bank.up.format
            && self.q8_set(bank.gate.format).is_some()
            && self.q8_set(bank.down.format).is_some();
        let (order, offsets) = (self.order.ptr, self.offsets.ptr);
        if grouped {
            let (nr, slots) = ((n * k) as i32, bank.slots as i32);
            launch(
                "moe",
                &self.k.moe_group,
                self.raw(),
                (1, 1, 1),
                1024,
                ((bank.slots + 1) * 4) as u32,
                &mut args![routes.mem.ptr, nr, slots, mask, order, offsets],
            )?;
        }
        let rows_grid = |rows: usize| {
            let y = if grouped { bank.slots } else { n * k };
            (rows.div_ceil(kernels::MM_WARPS) as u32, y as u32, 1)
        };
        let act_ptr = self.act.ptr;
        if fast {
            let r = self.q8_regions("moe", n * hidden, n * k * inter)?;
            let gate = self.q8_set(bank.gate.format).expect("checked above");
            let down = self.q8_set(bank.down.format).expect("checked above");
            let q8_grid = |rows: usize, per: usize| {
                let y = if grouped { bank.slots } else { n * k };
                (rows.div_ceil(per) as u32, y as u32, 1)
            };
            let rp = routes.mem.ptr;
            let mmq = grouped && n >= kernels::MMQ_MIN_TOKENS;
            // Per stage: tensor-core tiles for batches, grouped or
            // per-route matrix-vector kernels otherwise (the same bits).
            let pick = |tiles, grouped_f, per_route, tile_rows| {
                if mmq {
                    (tiles, tile_rows, kernels::MQ_THREADS)
                } else if grouped {
                    (grouped_f, kernels::Q8_BLOCK_ROWS, kernels::Q8_THREADS)
                } else {
                    (per_route, kernels::Q8_BLOCK_ROWS, kernels::Q8_THREADS)
                }
            };
            let (xq, xd) = if let Some(q) = premade {
                (q.xq, q.xd)
            } else {
                self.quantize(gate, xp, n * hidden, r.xq, r.xd)?;
                (r.xq, r.xd)
            };
            // Routes one by one over rows that fit the one-token kernels:
            // those (the same bits, see kernels/q8one.cu).
            let fits =
                !grouped && hidden <= kernels::ONE_MAX_COLS && inter <= kernels::ONE_MAX_COLS;
            if let (true, Some(g1), Some(d1)) = (fits, gate.one.as_ref(), down.one.as_ref()) {
                let nr = (n * k) as i32;
                let work = kernels::OneWork::GateUp {
                    routes: n * k,
                    inter,
                };
                let l = g1.gate_up.config(bank.gate.format, hidden, work)?;
                let args = &mut args![xq, xd, rp, kk, nr, mask, view, a, act_ptr];
                launch(
                    "moe",
                    &g1.gate_up.f,
                    self.raw(),
                    l.grid,
                    l.threads,
                    l.smem,
                    args,
                )?;
                self.quantize(down, act_ptr, n * k * inter, r.aq, r.ad)?;
                let work = kernels::OneWork::Down {
                    routes: n * k,
                    hidden,
                };
                let l = d1.down.config(bank.down.format, inter, work)?;
                let args = &mut args![r.aq, r.ad, rp, nr, mask, view, yp];
                return launch(
                    "moe",
                    &d1.down.f,
                    self.raw(),
                    l.grid,
                    l.threads,
                    l.smem,
                    args,
                );
            }
            // Routes one by one on the integer tensor cores where asked
            // for (MXFP4; the same bits, see kernels/q8mma.cu). The gate/up
            // launch also quantizes the down products' input.
            let mma_fits = !grouped
                && hidden <= kernels::MMA_MAX_COLS
                && inter <= kernels::MMA_MAX_COLS
                && inter % kernels::MMA_GU_ROWS == 0;
            if let (true, Some(g_mma), Some(d_mma)) =
                (mma_fits, gate.mma.as_ref(), down.mma.as_ref())
            {
                let (g_mma, d_mma) = (g_mma.gate_up_for(hidden), d_mma.down_for(inter));
                let routes_y = (n * k) as u32;
                let (aq, ad) = (r.aq, r.ad);
                let args = &mut args![xq, xd, rp, kk, mask, view, a, act_ptr, aq, ad];
                let grid = ((inter / kernels::MMA_GU_ROWS) as u32, routes_y, 1);
                let threads = kernels::MMA_GU_THREADS;
                launch("moe", g_mma, self.raw(), grid, threads, 0, args)?;
                let args = &mut args![aq, ad, rp, mask, view, yp];
                let grid = (hidden.div_ceil(kernels::MMA_ROWS) as u32, routes_y, 1);
                return launch(
                    "moe",
                    d_mma,
                    self.raw(),
                    grid,
                    kernels::MMA_THREADS,
                    0,
                    args,
                );
            }
            // Route by route, the gate/up launch may read its route and
            // first weights before its wait (unless TURBOSPARK_CUDA_GATE_UP=wait)
            // where the quantization above stands between the routing and
            // it (not when the router's launch made the input).
            let route_gate_up = match (premade, gate.route.gate_up_early_for(hidden)) {
                (None, Some(early)) => early,
                _ => gate.route.gate_up_for(hidden),
            };
            let (f, per, threads) = pick(
                &gate.mq_gate_up,
                &gate.gate_up_grouped,
                route_gate_up,
                kernels::MQ_BM / 2,
            );
            let grouped_args = &mut args![xq, xd, order, offsets, kk, view, a, act_ptr];
            let route_args = &mut args![xq, xd, rp, kk, mask, view, a, act_ptr];
            let args = if grouped { grouped_args } else { route_args };
            launch("moe", f, self.raw(), q8_grid(inter, per), threads, 0, args)?;
            self.quantize(down, act_ptr, n * k * inter, r.aq, r.ad)?;
            let (f, per, threads) = pick(
                &down.mq_down,
                &down.down_grouped,
                down.route.down_for(inter),
                kernels::MQ_BM,
            );
            let grouped_args = &mut args![r.aq, r.ad, order, offsets, view, yp];
            let route_args = &mut args![r.aq, r.ad, rp, mask, view, yp];
            let args = if grouped { grouped_args } else { route_args };
            return launch("moe", f, self.raw(), q8_grid(hidden, per), threads, 0, args);
        }
        if self.kq_experts(bank, xp, act_ptr).is_some() {
            // kq.cu's formats against 8-bit activations: routes
            // one by one, or grouped by expert on the integer tensor cores;
            // the same bits either way. Both inputs quantized in natural
            // order, as for Q8_0.
            let r = self.q8_regions("moe", n * hidden, n * k * inter)?;
            let (gu, down) = self.kq_experts(bank, xp, act_ptr).expect("checked above");
            let natural = self
                .q8_set(QuantFormat::Q8_0)
                .expect("fast numerics (checked by kq_experts)");
            self.quantize(natural, xp, n * hidden, r.xq, r.xd)?;
            let (xq, xd, aq, ad) = (r.xq, r.xd, r.aq, r.ad);
            if grouped {
                let slots = bank.slots as u32;
                let threads = kernels::MQ_THREADS;
                let grid = ((inter.div_ceil(kernels::MQ_BM / 2)) as u32, slots, 1);
                let args = &mut args![xq, xd, order, offsets, kk, view, a, act_ptr];
                launch("moe", &gu.gate_up_tile, self.raw(), grid, threads, 0, args)?;
                self.quantize(natural, act_ptr, n * k * inter, aq, ad)?;
                let grid = (hidden.div_ceil(kernels::MQ_BM) as u32, slots, 1);
                let args = &mut args![aq, ad, order, offsets, view, yp];
                return launch("moe", &down.down_tile, self.raw(), grid, threads, 0, args);
            }
            let routes_y = (n * k) as u32;
            let rows = |r: usize| (r.div_ceil(kernels::Q8_BLOCK_ROWS) as u32, routes_y, 1);
            let rp = routes.mem.ptr;
            let threads = kernels::Q8_THREADS;
            let args = &mut args![xq, xd, rp, kk, mask, view, a, act_ptr];
            launch(
                "moe",
                &gu.gate_up1,
                self.raw(),
                rows(inter),
                threads,
                0,
                args,
            )?;
            self.quantize(natural, act_ptr, n * k * inter, aq, ad)?;
            let args = &mut args![aq, ad, rp, mask, view, yp];
            return launch(
                "moe",
                &down.down1,
                self.raw(),
                rows(hidden),
                threads,
                0,
                args,
            );
        }
        if let Some((gu, down)) = self.tc_experts(bank, xp, act_ptr) {
            // Fast numerics on the tensor cores (kernels/tcmoe.cu): routes
            // one by one, or grouped by expert; the same bits either way.
            let rp = routes.mem.ptr;
            if grouped {
                let slots = bank.slots as u32;
                let rows = |r: usize| (r.div_ceil(kernels::TC_BATCH_ROWS) as u32, slots, 1);
                let threads = kernels::TC_BATCH_THREADS;
                let args = &mut args![xp, order, offsets, kk, view, a, act_ptr];
                launch(
                    "moe",
                    &gu.gate_up_grouped,
                    self.raw(),
                    rows(inter),
                    threads,
                    0,
                    args,
                )?;
                let args = &mut args![act_ptr, order, offsets, view, yp];
                return launch(
                    "moe",
                    &down.down_grouped,
                    self.raw(),
                    rows(hidden),
                    threads,
                    0,
                    args,
                );
            }
            let routes_y = (n * k) as u32;
            let tiles = |r: usize| (r.div_ceil(16) as u32, routes_y, 1);
            let threads = |cols: usize| (kernels::tc_segments(cols) * 32) as u32;
            let args = &mut args![xp, rp, kk, mask, view, a, act_ptr];
            launch(
                "moe",
                &gu.gate_up_few,
                self.raw(),
                tiles(inter),
                threads(hidden),
                0,
                args,
            )?;
            let args = &mut args![act_ptr, rp, mask, view, yp];
            return launch(
                "moe",
                &down.down_few,
                self.raw(),
                tiles(hidden),
                threads(inter),
                0,
                args,
            );
        }
        if !grouped {
            for &(fmt, mode) in passes {
                launch(
                    "moe",
                    self.k.moe_gate_up.get(fmt),
                    self.raw(),
                    rows_grid(inter),
                    threads,
                    0,
                    &mut args![xp, routes.mem.ptr, kk, mask, view, a, act_ptr, mode],
                )?;
            }
            return launch(
                "moe",
                self.k.moe_down.get(bank.down.format),
                self.raw(),
                rows_grid(hidden),
                threads,
                0,
                &mut args![act_ptr, routes.mem.ptr, mask, view, yp],
            );
        }
        for &(fmt, mode) in passes {
            launch(
                "moe",
                self.k.moe_gate_up_grouped.get(fmt),
                self.raw(),
                rows_grid(inter),
                threads,
                0,
                &mut args![xp, order, offsets, kk, view, a, act_ptr, mode],
            )?;
        }
        launch(
            "moe",
            self.k.moe_down_grouped.get(bank.down.format),
            self.raw(),
            rows_grid(hidden),
            threads,
            0,
            &mut args![act_ptr, order, offsets, view, yp],
        )
    }

    /// The gate/up stage of
    /// [`Stream::moe_experts`](turbospark_backend::Stream::moe_experts)
    /// (the per-route `moe_gate_up` kernels of moe.cu) writing its
    /// `[n · k, inter]` activations into `out` instead of the stream's own
    /// buffer.
    pub(super) fn enqueue_moe_intermediate(
        &mut self,
        input: MoeInput<'_, CudaDevice>,
        _scratch: &mut MoeScratch<CudaBuf>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        const OP: &str = "moe_intermediate";
        let MoeInput {
            x,
            n_tokens: n,
            routes,
            bank,
            activation: act,
        } = input;
        if n == 0 {
            return Ok(());
        }
        let k = routes_for(OP, routes, n)?;
        let (hidden, inter) = (bank.hidden, bank.inter);
        let xp = x.f32_ptr(OP, "x", n * hidden)?;
        let op = out.f32_ptr(OP, "out", n * k * inter)?;
        if routes.max_slot as usize >= bank.slots {
            return Err(BackendError::BadRoute {
                slot: routes.max_slot as usize,
                available: bank.slots,
            });
        }
        let all = kernels::SlotMask {
            bits: [0; kernels::MAX_MASK_SLOTS / 32],
            on: 0,
        };
        let view = Self::bank_view(bank);
        let a = activation(act);
        let kk = k as i32;
        let passes: &[(turbospark_core::QuantFormat, i32)] = if bank.gate.format == bank.up.format {
            &[(bank.gate.format, 0)]
        } else {
            &[(bank.gate.format, 1), (bank.up.format, 2)]
        };
        self.bind(OP)?;
        let grid = (inter.div_ceil(kernels::MM_WARPS) as u32, (n * k) as u32, 1);
        for &(fmt, mode) in passes {
            launch(
                OP,
                self.k.moe_gate_up.get(fmt),
                self.raw(),
                grid,
                (kernels::MM_WARPS * 32) as u32,
                0,
                &mut args![xp, routes.mem.ptr, kk, all, view, a, op, mode],
            )?;
        }
        Ok(())
    }

    pub(super) fn enqueue_moe_combine(
        &mut self,
        n_tokens: usize,
        hidden: usize,
        routes: &CudaRoutes,
        scratch: &MoeScratch<CudaBuf>,
        out: &mut CudaBuf,
    ) -> Result<(), BackendError> {
        if n_tokens == 0 || hidden == 0 {
            return Ok(());
        }
        let k = routes_for("moe", routes, n_tokens)?;
        if k == 0 {
            return Err(shape("moe", format!("no routes for {n_tokens} tokens")));
        }
        let yp = scratch
            .y
            .f32_ptr("moe", "scratch.y", n_tokens * k * hidden)?;
        let op = out.f32_ptr("moe", "out", n_tokens * hidden)?;
        // Held for the residual add that reads `out`, whose norm may form
        // the sum itself (see crate::fusion).
        self.quantized.set(None);
        self.bind_holding("moe")?;
        self.hold(Pending::Combine(fusion::CombineLaunch {
            y: yp,
            routes: routes.mem.ptr,
            n: n_tokens,
            k,
            hidden,
            out: op,
        }))
    }
}
