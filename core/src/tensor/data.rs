//! [`TensorData`]: a tensor's values on the host with its dtype and sizes and
//! no static type, as a state_dict entry or a checkpoint record holds them.

use super::{ok, Tensor};
use crate::device::Backend;
use crate::dtype::{DType, Dtype};
use crate::error::{fmt_dims, Error, Result};
use crate::layout::Layout;
use crate::shape::Shape;
use half::{bf16, f16};

/// Host values of any dtype, little-endian bytes in row-major order (the
/// layout of a safetensors record).
#[derive(Clone, PartialEq)]
pub struct TensorData {
    dtype: DType,
    dims: Vec<usize>,
    bytes: Vec<u8>,
}

impl std::fmt::Debug for TensorData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorData({} {})", fmt_dims(&self.dims), self.dtype)
    }
}

/// Bytes per element of a dtype.
pub fn dtype_size(dtype: DType) -> usize {
    match dtype {
        DType::F64 | DType::I64 => 8,
        DType::F32 | DType::U32 => 4,
        DType::F16 | DType::BF16 => 2,
        DType::Bool => 1,
    }
}

fn encode<E: Dtype>(values: &[E]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype_size(E::DTYPE));
    for &v in values {
        match E::DTYPE {
            DType::F32 => out.extend_from_slice(&v.cast::<f32>().to_le_bytes()),
            DType::F64 => out.extend_from_slice(&v.cast::<f64>().to_le_bytes()),
            DType::F16 => out.extend_from_slice(&v.cast::<f16>().to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&v.cast::<bf16>().to_le_bytes()),
            DType::I64 => out.extend_from_slice(&v.cast::<i64>().to_le_bytes()),
            DType::U32 => out.extend_from_slice(&v.cast::<u32>().to_le_bytes()),
            DType::Bool => out.push(u8::from(v.cast::<bool>())),
        }
    }
    out
}

fn decode<F: Dtype>(dtype: DType, bytes: &[u8]) -> Vec<F> {
    fn each<const N: usize, T: Dtype, F: Dtype>(
        bytes: &[u8],
        conv: impl Fn([u8; N]) -> T,
    ) -> Vec<F> {
        bytes
            .chunks_exact(N)
            .map(|c| conv(c.try_into().expect("chunks_exact yields N bytes")).cast::<F>())
            .collect()
    }
    match dtype {
        DType::F32 => each(bytes, f32::from_le_bytes),
        DType::F64 => each(bytes, f64::from_le_bytes),
        DType::F16 => each(bytes, f16::from_le_bytes),
        DType::BF16 => each(bytes, bf16::from_le_bytes),
        DType::I64 => each(bytes, i64::from_le_bytes),
        DType::U32 => each(bytes, u32::from_le_bytes),
        DType::Bool => each(bytes, |[b]: [u8; 1]| b != 0),
    }
}

impl TensorData {
    /// Wraps little-endian bytes, checking that they fill `dims` exactly.
    ///
    /// # Errors
    /// [`Error::DataLength`] when the byte count is not `numel * dtype size`.
    pub fn from_bytes(dtype: DType, dims: Vec<usize>, bytes: Vec<u8>) -> Result<Self> {
        let numel = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| Error::invalid("TensorData", "the element count overflows"))?;
        let size = dtype_size(dtype);
        if bytes.len() != numel.saturating_mul(size) {
            return Err(Error::DataLength {
                op: "TensorData::from_bytes",
                len: bytes.len() / size,
                numel,
                shape: fmt_dims(&dims),
            });
        }
        Ok(TensorData { dtype, dims, bytes })
    }

    /// Typed values; their count must fill `dims`.
    ///
    /// # Errors
    /// [`Error::DataLength`] when it does not.
    pub fn from_vec<E: Dtype>(values: &[E], dims: Vec<usize>) -> Result<Self> {
        Self::from_bytes(E::DTYPE, dims, encode(values))
    }

    /// The dtype of the values.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The sizes.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// The little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The values converted to `F` with `torch.Tensor.to`'s rules.
    pub fn to_vec<F: Dtype>(&self) -> Vec<F> {
        decode(self.dtype, &self.bytes)
    }
}

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// A host copy of the values with their dtype and sizes.
    #[track_caller]
    pub fn to_data(&self) -> TensorData {
        ok(self.try_to_data())
    }

    /// Fallible [`Tensor::to_data`] (a device copy can fail).
    pub fn try_to_data(&self) -> Result<TensorData> {
        TensorData::from_vec(&self.try_to_vec()?, self.layout.dims.to_vec())
    }

    /// A new tensor on `device` from host data, converting its dtype to `E`.
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the sizes do not fit `S`.
    pub fn try_from_data(data: &TensorData, device: &D) -> Result<Self> {
        if S::from_dims(data.dims()).is_none() {
            return Err(Error::shape("from_data", S::describe(), data.dims()));
        }
        let s = device.upload(data.to_vec::<E>())?;
        Ok(Self::from_storage(s, data.dims(), device.clone()).constant())
    }

    /// Overwrites the values in place (every view and clone sees them; the
    /// autograd state is kept), converting the dtype, like `param.copy_(src)`
    /// under no-grad.
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the sizes differ.
    pub fn try_assign_data(&self, data: &TensorData) -> Result<()> {
        if data.dims() != &self.layout.dims[..] {
            return Err(Error::shape(
                "assign_data",
                fmt_dims(&self.layout.dims),
                data.dims(),
            ));
        }
        let src = self.device.upload(data.to_vec::<E>())?;
        let src_layout = Layout::contiguous(data.dims());
        let mut dst = self.storage_mut();
        self.device
            .copy_strided(&src, &src_layout, &mut dst, &self.layout)
    }
}

impl<S: Shape, E: Dtype, D: Backend> Tensor<S, E, D> {
    /// Overwrites the values in place with those of `src` (same sizes), outside
    /// the autograd graph, like `self.copy_(src)` under no-grad. Every view and
    /// clone of `self` sees the new values.
    ///
    /// # Errors
    /// A [`crate::ShapeError`] when the sizes differ.
    pub fn try_assign<S2: Shape>(&self, src: &Tensor<S2, E, D>) -> Result<()> {
        if src.layout.dims != self.layout.dims {
            return Err(Error::shape(
                "assign",
                fmt_dims(&self.layout.dims),
                &src.layout.dims,
            ));
        }
        // Reading and writing one storage would deadlock its lock: copy first.
        let src = if std::sync::Arc::ptr_eq(&self.storage, &src.storage) {
            let s = self.device.contiguous(&src.storage(), &src.layout)?;
            Tensor::<S2, E, D>::from_storage(s, &src.layout.dims, self.device.clone())
        } else {
            src.clone()
        };
        let from = src.storage();
        let mut dst = self.storage_mut();
        self.device
            .copy_strided(&from, &src.layout, &mut dst, &self.layout)
    }

    /// Sets every element to `value` in place, like `tensor.fill_(value)`
    /// under no-grad (every view and clone sees it; the version counter
    /// moves on, so a backward that saved this tensor refuses to run).
    ///
    /// # Errors
    /// A backend failure.
    pub fn try_fill(&self, value: f64) -> Result<()> {
        let src = self.device.full(1, E::from_f64(value))?;
        let from = Layout::contiguous(&[]).broadcast_to(&self.layout.dims);
        let mut dst = self.storage_mut();
        self.device
            .copy_strided(&src, &from, &mut dst, &self.layout)
    }

    /// [`Tensor::try_fill`] that panics on a backend failure.
    ///
    /// ```
    /// use forma::prelude::*;
    /// let x = Tensor::<(C<3>,)>::zeros();
    /// x.fill(2.5);
    /// assert_eq!(x.to_vec(), [2.5; 3]);
    /// ```
    #[track_caller]
    pub fn fill(&self, value: f64) {
        ok(self.try_fill(value))
    }

    /// [`Tensor::try_assign`] for sizes the types already guarantee equal
    /// (`Dyn` sizes are checked at run time).
    ///
    /// # Panics
    /// If `Dyn` sizes differ.
    #[track_caller]
    pub fn assign(&self, src: &Tensor<S, E, D>) {
        ok(self.try_assign(src))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype_through_bytes() {
        let v = [1.5f32, -2.0, 0.25];
        let d = TensorData::from_vec(&v, vec![3]).unwrap();
        assert_eq!(d.bytes().len(), 12);
        assert_eq!(d.to_vec::<f32>(), v);
        assert_eq!(d.to_vec::<f64>(), [1.5, -2.0, 0.25]);
        assert_eq!(d.to_vec::<i64>(), [1, -2, 0]);
        let h = TensorData::from_vec(&[bf16::from_f32(3.0)], vec![]).unwrap();
        assert_eq!(h.to_vec::<f32>(), [3.0]);
        let b = TensorData::from_vec(&[true, false], vec![2]).unwrap();
        assert_eq!(b.bytes(), [1, 0]);
    }

    #[test]
    fn rejects_bytes_that_do_not_fill_the_shape() {
        let e = TensorData::from_bytes(DType::F32, vec![2, 2], vec![0; 15]).unwrap_err();
        assert!(e.to_string().contains("[2, 2]"), "{e}");
    }
}
