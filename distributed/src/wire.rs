//! The element types that travel between processes: MPI and NCCL reduce
//! `f32`, `f64` and `i64` natively; `f16`/`bf16` are widened to `f32` for the
//! reduction (no extra rounding: the sum of the widened values is rounded
//! once, when written back) and anything can travel as bytes.

use forma_core::{DType, Dtype};

/// A contiguous buffer the communication library reads and writes.
#[derive(Debug)]
pub(crate) enum BufMut<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    I64(&'a mut [i64]),
    U8(&'a mut [u8]),
}

// Read by the MPI backend only.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
impl BufMut<'_> {
    pub(crate) fn len(&self) -> usize {
        match self {
            BufMut::F32(s) => s.len(),
            BufMut::F64(s) => s.len(),
            BufMut::I64(s) => s.len(),
            BufMut::U8(s) => s.len(),
        }
    }

    pub(crate) fn wire(&self) -> Wire {
        match self {
            BufMut::F32(_) => Wire::F32,
            BufMut::F64(_) => Wire::F64,
            BufMut::I64(_) => Wire::I64,
            BufMut::U8(_) => Wire::U8,
        }
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            BufMut::F32(s) => s.as_mut_ptr().cast(),
            BufMut::F64(s) => s.as_mut_ptr().cast(),
            BufMut::I64(s) => s.as_mut_ptr().cast(),
            BufMut::U8(s) => s.as_mut_ptr(),
        }
    }
}

/// A wire element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) enum Wire {
    F32,
    F64,
    I64,
    U8,
}

impl Wire {
    pub(crate) fn size(self) -> usize {
        match self {
            Wire::F32 => 4,
            Wire::F64 | Wire::I64 => 8,
            Wire::U8 => 1,
        }
    }
}

/// Views `values` as the wire buffer of its own type, when the library
/// reduces that type natively (`f32`, `f64`, `i64`).
pub(crate) fn native_mut<E: Dtype>(values: &mut [E]) -> Option<BufMut<'_>> {
    let (ptr, len) = (values.as_mut_ptr(), values.len());
    // SAFETY: the dtype tag says `E` is exactly the element type named, so
    // the cast reinterprets a slice as itself.
    unsafe {
        match E::DTYPE {
            DType::F32 => Some(BufMut::F32(std::slice::from_raw_parts_mut(ptr.cast(), len))),
            DType::F64 => Some(BufMut::F64(std::slice::from_raw_parts_mut(ptr.cast(), len))),
            DType::I64 => Some(BufMut::I64(std::slice::from_raw_parts_mut(ptr.cast(), len))),
            _ => None,
        }
    }
}

/// The bytes of `values`, for a broadcast of any dtype.
pub(crate) fn bytes_mut<E: Dtype>(values: &mut [E]) -> &mut [u8] {
    let len = std::mem::size_of_val(values);
    // SAFETY: every Forma dtype is plain data (floats, integers, a bool
    // written only as 0 or 1 by its owner, which a broadcast copies whole).
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), len) }
}
