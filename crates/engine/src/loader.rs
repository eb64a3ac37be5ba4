//! Reading a model's weights from a [`WeightSource`] onto a device, by
//! [`Role`]: the tensors of each place come from the one tensor table
//! ([`turbospark_format::roles::TENSORS`]) with their names and shapes, and
//! each is checked against its shape, so a weight source other than a
//! validated install cannot slip a wrong shape in. The FFN and layer
//! weights ([`crate::weights`]) and each token mixer's
//! ([`crate::mixers`]) load through it.

use crate::source::WeightSource;
use crate::EngineError;
use std::collections::HashMap;
use turbospark_backend::{Device, HostTensor};
use turbospark_core::arch::ArchSpec;
use turbospark_format::roles::{present, Placement, Role};

/// Reads weights from a source and uploads them to a device.
pub(crate) struct Loader<'a, D: Device> {
    pub(crate) src: &'a dyn WeightSource,
    pub(crate) be: &'a D,
    /// Load routed experts (not when they are streamed).
    pub(crate) experts: bool,
}

pub(crate) fn check_shape(t: &HostTensor, expected: &[usize]) -> Result<(), EngineError> {
    if t.shape != expected {
        return Err(EngineError::TensorShape {
            name: t.name.clone(),
            expected: expected.to_vec(),
            found: t.shape.clone(),
        });
    }
    Ok(())
}

/// The tensors of one place (the globals, or one layer) that the table
/// lists for the spec: name and shape by role.
pub(crate) struct Listed {
    by_role: HashMap<Role, (String, Vec<usize>)>,
}

impl Listed {
    pub(crate) fn of(spec: &ArchSpec, placement: Placement, layer: usize) -> Self {
        let by_role = present(spec, placement, layer)
            .into_iter()
            .map(|p| {
                let shape = p.shape.iter().map(|&d| d as usize).collect();
                (p.role, (p.name, shape))
            })
            .collect();
        Listed { by_role }
    }

    pub(crate) fn get(&self, role: Role) -> Option<(&str, &[usize])> {
        self.by_role
            .get(&role)
            .map(|(n, s)| (n.as_str(), s.as_slice()))
    }

    /// A role the decoder needs whenever the table lists the place at all.
    pub(crate) fn required(&self, role: Role) -> Result<(&str, &[usize]), EngineError> {
        self.get(role).ok_or(EngineError::NotImplemented {
            feature: "a spec whose tensor table lacks a required tensor",
        })
    }
}

impl<D: Device> Loader<'_, D> {
    fn upload_matrix(&self, name: &str, shape: &[usize]) -> Result<D::Matrix, EngineError> {
        let t = self.src.resident(name)?;
        check_shape(&t, shape)?;
        let m = self.be.upload_matrix(&t)?;
        if self.be.copies_weights() {
            // Keeps loading's peak memory near the copy's size.
            self.src.release_resident(name);
        }
        Ok(m)
    }

    fn upload_vector(&self, name: &str, shape: &[usize]) -> Result<D::Vector, EngineError> {
        let t = self.src.resident(name)?;
        check_shape(&t, shape)?;
        Ok(self.be.upload_vector(&t)?)
    }

    pub(crate) fn matrix(&self, ts: &Listed, role: Role) -> Result<D::Matrix, EngineError> {
        let (name, shape) = ts.required(role)?;
        self.upload_matrix(name, shape)
    }

    pub(crate) fn opt_matrix(
        &self,
        ts: &Listed,
        role: Role,
    ) -> Result<Option<D::Matrix>, EngineError> {
        ts.get(role)
            .map(|(name, shape)| self.upload_matrix(name, shape))
            .transpose()
    }

    /// A 1-D tensor (bias, norm weight, scale), when the table lists it.
    pub(crate) fn vector(&self, ts: &Listed, role: Role) -> Result<Option<D::Vector>, EngineError> {
        ts.get(role)
            .map(|(name, shape)| self.upload_vector(name, shape))
            .transpose()
    }

    /// A 1-D tensor read to the host as f32 (values the host-side code,
    /// not the backend, uses), when the table lists it.
    pub(crate) fn host_vector(
        &self,
        ts: &Listed,
        role: Role,
    ) -> Result<Option<Vec<f32>>, EngineError> {
        let Some((name, shape)) = ts.get(role) else {
            return Ok(None);
        };
        let t = self.src.resident(name)?;
        check_shape(&t, shape)?;
        let mut v = vec![0f32; shape.iter().product()];
        turbospark_core::quant::dequantize_row(t.format, t.bytes.as_slice(), &mut v).map_err(
            |source| turbospark_backend::BackendError::Quant {
                name: t.name.clone(),
                source,
            },
        )?;
        Ok(Some(v))
    }

    /// Rows `rows` of the matrix `role`, in its own format, as a matrix
    /// named `name` (the bytes are shared, not copied).
    pub(crate) fn row_block(
        &self,
        ts: &Listed,
        role: Role,
        name: String,
        rows: std::ops::Range<usize>,
    ) -> Result<D::Matrix, EngineError> {
        let (src_name, shape) = ts.required(role)?;
        let t = self.src.resident(src_name)?;
        check_shape(&t, shape)?;
        Ok(self.be.upload_matrix(&t.row_block(name, rows)?)?)
    }

    /// Part `part` of routed expert `e` of layer `l`, with its shape.
    pub(crate) fn expert_part(
        &self,
        l: usize,
        e: usize,
        part: &str,
        shape: &[usize],
    ) -> Result<HostTensor, EngineError> {
        let t = self.src.expert_part(l, e, part)?;
        check_shape(&t, shape)?;
        Ok(t)
    }
}
