//! Forma's CPU backend: [`Cpu`] implements [`Backend`] and every kernel trait
//! of `forma-core` on `Vec<E>` storages. Kernels work on erased sizes
//! ([`Layout`]), run in parallel above a size threshold (on `par`'s spinning
//! pool, sized by rayon's thread count), compute half types in f32, and are
//! generic over the op so hot loops have no dispatch.

mod cast;
mod concat;
mod dense;
pub mod ops;
mod par;
mod rows;
mod simd;
pub mod strided;

pub use dense::tune_allocator;
use forma_core::{Backend, DefaultDevice, Dtype, Layout, Result};
use std::mem::MaybeUninit;
use strided::StridedIter;

/// Elements per parallel task: below this, work stays on one thread.
pub const PAR_CHUNK: usize = 1 << 15;

/// The CPU device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu;

impl DefaultDevice for Cpu {
    fn default_device() -> Self {
        Cpu
    }
}

/// Fills `out` (row-major over the common sizes of `layouts`) with
/// `f(offsets)`, the storage offset of each element in each layout. The walk
/// goes row by row: an inner loop over the last dim with fixed strides (which
/// the compiler vectorises for strides 0 and 1), and parallel chunks of rows
/// for large outputs. Dense, unbroadcast operands are walked as one row.
pub fn map_strided<T: Copy + Send, const K: usize>(
    out: &mut [T],
    layouts: [&Layout; K],
    f: impl Fn([usize; K]) -> T + Sync,
) {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, and `walk` only writes
    // initialised values (`T: Copy`, so nothing is dropped unwritten).
    let out = unsafe { &mut *(out as *mut [T] as *mut [MaybeUninit<T>]) };
    walk(out, layouts, f);
}

/// A new row-major vector with `f(offsets)` for each element of the common
/// sizes of `layouts` (see [`map_strided`]), written once into uninitialised
/// memory rather than zero-filled first.
pub fn collect_strided<T: Copy + Send, const K: usize>(
    layouts: [&Layout; K],
    f: impl Fn([usize; K]) -> T + Sync,
) -> Vec<T> {
    tune_allocator();
    let n = layouts.first().map_or(0, |l| l.numel());
    let mut out = Vec::with_capacity(n);
    walk(&mut out.spare_capacity_mut()[..n], layouts, f);
    // SAFETY: `walk` writes every one of the `n` slots.
    unsafe { out.set_len(n) };
    out
}

fn walk<T: Send, const K: usize>(
    out: &mut [MaybeUninit<T>],
    layouts: [&Layout; K],
    f: impl Fn([usize; K]) -> T + Sync,
) {
    let Some(first) = layouts.first() else { return };
    debug_assert!(layouts.iter().all(|l| l.dims == first.dims) && out.len() == first.numel());
    if out.is_empty() {
        return;
    }
    // Rows as long as the views allow: an expanded scalar is one row of
    // stride 0 rather than a row of one element per position.
    let merged = Layout::coalesce(layouts);
    let layouts = merged.each_ref();
    let first = &merged[0];
    let dense = layouts.iter().all(|l| l.is_contiguous());
    let (outer, n, strides): ([Layout; K], usize, [usize; K]) = if dense || first.rank() == 0 {
        let flat = |l: &Layout| Layout {
            offset: l.offset,
            ..Layout::contiguous(&[])
        };
        (layouts.map(flat), out.len(), [if dense { 1 } else { 0 }; K])
    } else {
        let r = first.rank();
        (
            layouts.map(|l| l.remove_axis(r - 1)),
            first.dims[r - 1],
            layouts.map(|l| l.strides[r - 1]),
        )
    };
    let walk = Walk {
        outer,
        n,
        strides,
        f,
    };
    // Each chunk runs compiled for the CPU's widest vectors and with FMA
    // (`simd::run`), as the dense paths do: the kernels' polynomials use
    // `mul_add`, a libm call in a baseline loop.
    if out.len() >= 2 * PAR_CHUNK && n >= out.len() {
        // One long row: split it, each piece starting mid-row.
        par::chunks_mut(out, PAR_CHUNK, |c, chunk| {
            walk.run(false, c * PAR_CHUNK, chunk)
        });
    } else {
        par::units_mut(out, n, |row0, chunk| walk.run(true, row0, chunk));
    }
}

/// The strided walk's loops: `f` of each element's offsets, over whole
/// rows of the last dim (`n` long, offsets `strides` apart), the rows'
/// starts from `outer`. Inlined into `simd::run`'s copies.
struct Walk<const K: usize, F> {
    outer: [Layout; K],
    n: usize,
    strides: [usize; K],
    f: F,
}

impl<const K: usize, F> Walk<K, F> {
    /// Rows `start..` (`rows`) or elements `start..` of one long row into
    /// `chunk`, vectorised for the CPU it runs on.
    fn run<T>(&self, rows: bool, start: usize, chunk: &mut [MaybeUninit<T>])
    where
        F: Fn([usize; K]) -> T,
    {
        simd::run(Part {
            walk: self,
            rows,
            start,
            chunk,
        });
    }

    /// Rows `row0..` into `chunk` (whole rows).
    #[inline(always)]
    fn rows<T>(&self, row0: usize, chunk: &mut [MaybeUninit<T>])
    where
        F: Fn([usize; K]) -> T,
    {
        let mut its = self.outer.each_ref().map(|l| StridedIter::new(l, row0));
        for orow in chunk.chunks_mut(self.n) {
            let bases: [usize; K] = std::array::from_fn(|i| its[i].next_offset());
            self.line(bases, orow);
        }
    }

    /// Elements `start..` of one long row into `chunk`.
    #[inline(always)]
    fn span<T>(&self, start: usize, chunk: &mut [MaybeUninit<T>])
    where
        F: Fn([usize; K]) -> T,
    {
        let bases = std::array::from_fn(|i| self.outer[i].offset + start * self.strides[i]);
        self.line(bases, chunk);
    }

    #[inline(always)]
    fn line<T>(&self, bases: [usize; K], out: &mut [MaybeUninit<T>])
    where
        F: Fn([usize; K]) -> T,
    {
        for (k, o) in out.iter_mut().enumerate() {
            o.write((self.f)(std::array::from_fn(|i| {
                bases[i] + k * self.strides[i]
            })));
        }
    }
}

/// One chunk of a [`Walk`], as a [`simd::Vectorized`] loop.
struct Part<'a, W, T> {
    walk: &'a W,
    rows: bool,
    start: usize,
    chunk: &'a mut [MaybeUninit<T>],
}

impl<const K: usize, T, F: Fn([usize; K]) -> T> simd::Vectorized for Part<'_, Walk<K, F>, T> {
    type Out = ();
    #[inline(always)]
    fn run(self) {
        if self.rows {
            self.walk.rows(self.start, self.chunk);
        } else {
            self.walk.span(self.start, self.chunk);
        }
    }
}

/// Fills `out` (row-major over `layout`'s sizes) with `f(offset)` for each
/// element's storage offset.
pub fn fill_strided<T: Copy + Send>(out: &mut [T], layout: &Layout, f: impl Fn(usize) -> T + Sync) {
    map_strided(out, [layout], |[o]| f(o));
}

/// Gathers a strided view into a new row-major `Vec`.
pub fn gather_vec<E: Dtype>(src: &[E], layout: &Layout) -> Vec<E> {
    if let Some(r) = layout.contiguous_range() {
        return src[r].to_vec();
    }
    collect_strided([layout], |[o]| src[o])
}

impl Backend for Cpu {
    type Storage<E: Dtype> = Vec<E>;

    fn grad_ops<F: Dtype>(&self) -> Option<&'static dyn forma_core::tape::GradOps<F, Self>> {
        forma_core::tape::float_grad_ops::<F, Self>()
    }

    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn upload<E: Dtype>(&self, data: Vec<E>) -> Result<Vec<E>> {
        dense::tune_allocator();
        Ok(data)
    }

    fn full<E: Dtype>(&self, len: usize, value: E) -> Result<Vec<E>> {
        dense::tune_allocator();
        Ok(vec![value; len])
    }

    fn to_vec<E: Dtype>(&self, src: &Vec<E>, layout: &Layout) -> Result<Vec<E>> {
        Ok(gather_vec(src, layout))
    }

    fn contiguous<E: Dtype>(&self, src: &Vec<E>, layout: &Layout) -> Result<Vec<E>> {
        Ok(gather_vec(src, layout))
    }

    fn copy_strided<E: Dtype>(
        &self,
        src: &Vec<E>,
        src_layout: &Layout,
        dst: &mut Vec<E>,
        dst_layout: &Layout,
    ) -> Result<()> {
        debug_assert_eq!(src_layout.dims, dst_layout.dims);
        // Rows contiguous on both sides (a `cat` or `stack` along an outer
        // axis, a KV cache's append): one slice copy per row, where the
        // element walk below costs several times a `memcpy`.
        let rank = src_layout.rank();
        if let Some(&n) = src_layout.dims.last() {
            let last = rank - 1;
            if n >= 8 && src_layout.strides[last] == 1 && dst_layout.strides[last] == 1 {
                let (so, dl) = (src_layout.remove_axis(last), dst_layout.remove_axis(last));
                let mut si = StridedIter::new(&so, 0);
                let mut di = StridedIter::new(&dl, 0);
                for _ in 0..so.numel() {
                    let (s, d) = (si.next_offset(), di.next_offset());
                    dst[d..d + n].copy_from_slice(&src[s..s + n]);
                }
                return Ok(());
            }
        }
        if let Some(r) = dst_layout.contiguous_range() {
            fill_strided(&mut dst[r], src_layout, |o| src[o]);
            return Ok(());
        }
        let mut si = StridedIter::new(src_layout, 0);
        let mut di = StridedIter::new(dst_layout, 0);
        for _ in 0..src_layout.numel() {
            dst[di.next_offset()] = src[si.next_offset()];
        }
        Ok(())
    }

    fn concat<E: Dtype>(&self, parts: &[(&Vec<E>, &Layout)], axis: usize) -> Result<Vec<E>> {
        Ok(concat::concat(parts, axis))
    }

    fn cast<E: Dtype, F: Dtype>(&self, src: &Vec<E>, layout: &Layout) -> Result<Vec<F>> {
        if let Some(out) = cast::fast::<E, F>(src, layout) {
            return Ok(out);
        }
        Ok(collect_strided([layout], |[o]| src[o].cast::<F>()))
    }
}
