//! Filling a streamed layer's VRAM expert slots on a [`CudaStream`]: whole
//! experts staged through the pinned ring, or projection rows copied by
//! DMA from registered host memory on the copy stream beside the compute
//! stream (see [`crate::staging`] and [`crate::pinned`]).

use super::{shape, CudaStream};
use crate::layout;
use crate::memory::runtime;
use crate::staging::{self, Lane};
use crate::types::CudaBank;
use cudarc::driver::sys;
use turbospark_backend::Stream;
use turbospark_backend::{bias_mismatch, BackendError, ExpertTensors, Projection};

impl CudaStream {
    /// The copy stream of `fill_slot` (made now if it is the first copy),
    /// or `None` when copies stay on this stream.
    fn copy_lane(&mut self) -> Result<Option<sys::CUstream>, BackendError> {
        if !self.copy_stream {
            return Ok(None);
        }
        let copies = match &self.copies {
            Some(c) => c,
            None => self
                .copies
                .insert(self.ctx.new_stream().map_err(runtime("fill_slot"))?),
        };
        Ok(Some(copies.cu_stream()))
    }

    pub(super) fn enqueue_fill_slot(
        &mut self,
        bank: &mut CudaBank,
        slot: usize,
        expert: &ExpertTensors,
    ) -> Result<(), BackendError> {
        for part in Projection::ALL {
            let rows = bank.projection(part).rows;
            self.fill_slot_rows(bank, slot, expert, part, 0..rows)?;
        }
        self.fill_slot_biases(bank, slot, expert)
    }

    pub(super) fn enqueue_fill_slot_rows(
        &mut self,
        bank: &mut CudaBank,
        slot: usize,
        expert: &ExpertTensors,
        part: Projection,
        rows: std::ops::Range<usize>,
    ) -> Result<(), BackendError> {
        if slot >= bank.slots {
            return Err(BackendError::BadRoute {
                slot,
                available: bank.slots,
            });
        }
        let (stacked, t) = (bank.projection(part), expert.projection(part));
        if t.format != stacked.format || t.bytes.len() != stacked.host_slot_bytes() {
            return Err(shape(
                "fill_slot",
                format!(
                    "{} ({}, {} bytes) does not fit a slot of {} bytes of {}",
                    t.name,
                    t.format,
                    t.bytes.len(),
                    stacked.host_slot_bytes(),
                    stacked.format
                ),
            ));
        }
        if rows.start > rows.end || rows.end > stacked.rows {
            return Err(shape(
                "fill_slot_rows",
                format!(
                    "rows {}..{} of {} past its {} rows",
                    rows.start, rows.end, t.name, stacked.rows
                ),
            ));
        }
        if rows.is_empty() {
            return Ok(());
        }
        self.bind("fill_slot")?;
        let cu = self.raw().cu_stream();
        let hrb = stacked.host_row_bytes;
        // The rows' byte range lies inside the stacked projection's slot
        // (slot < slots, rows within the slot's, both checked).
        let at =
            stacked.mem.ptr + (slot * stacked.slot_bytes() + rows.start * stacked.row_bytes) as u64;
        let host = &t.bytes.as_slice()[rows.start * hrb..rows.end * hrb];
        let pinned = self.pinned.contains(host);
        if layout::split_parts(stacked.format).is_none() {
            let staged = self
                .ring
                .stage(&self.ctx, Lane::Same(cu), host, pinned, Some(at))?;
            self.ring.release(staged, cu)?;
        } else {
            // Into a staging buffer, then the layout kernel into the slot:
            // the copy may run beside the stream.
            let lane = match self.copy_lane()? {
                Some(copies) => Lane::Beside {
                    copies,
                    compute: cu,
                },
                None => Lane::Same(cu),
            };
            let staged = self.ring.stage(&self.ctx, lane, host, pinned, None)?;
            let queued = layout::queue_split(
                &self.k,
                &self.stream,
                stacked.format,
                staged.device,
                at,
                rows.len(),
                hrb,
            );
            self.ring.release(staged, cu)?;
            queued?;
        }
        if pinned {
            let fence = match &mut self.fills {
                Some(f) => f,
                None => self.fills.insert(staging::Fence::new("fill_slot")?),
            };
            fence.record(cu, "fill_slot")?;
        }
        Ok(())
    }

    pub(super) fn enqueue_fill_slot_biases(
        &mut self,
        bank: &mut CudaBank,
        slot: usize,
        expert: &ExpertTensors,
    ) -> Result<(), BackendError> {
        if slot >= bank.slots {
            return Err(BackendError::BadRoute {
                slot,
                available: bank.slots,
            });
        }
        self.bind("fill_slot")?;
        let cu = self.raw().cu_stream();
        for (mem, t, len) in [
            (&bank.gate_bias, &expert.gate_bias, bank.inter),
            (&bank.up_bias, &expert.up_bias, bank.inter),
            (&bank.down_bias, &expert.down_bias, bank.hidden),
        ] {
            match (mem, t) {
                (Some(mem), Some(t)) => {
                    let mut v = vec![0f32; len];
                    turbospark_core::quant::dequantize_row(t.format, t.bytes.as_slice(), &mut v)
                        .map_err(|source| BackendError::Quant {
                            name: t.name.clone(),
                            source,
                        })?;
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    // slot < slots and each slot holds `len` floats.
                    let at = mem.ptr + (slot * len * 4) as u64;
                    let staged =
                        self.ring
                            .stage(&self.ctx, Lane::Same(cu), &bytes, false, Some(at))?;
                    self.ring.release(staged, cu)?;
                }
                (None, None) => {}
                _ => return Err(bias_mismatch(expert)),
            }
        }
        Ok(())
    }

    pub(super) fn enqueue_wait_slot_fills(&mut self) -> Result<(), BackendError> {
        self.bind_holding("wait_slot_fills")?;
        match &mut self.fills {
            Some(f) => f.wait("wait_slot_fills"),
            None => Ok(()),
        }
    }
}
