//! Composite rearranging ops against PyTorch
//! (`tools/fixtures/rearrange.safetensors`): `tril`/`triu` at three
//! diagonals (and NaN/Inf cleared), `roll` by positive, negative, wrapping
//! and zero shifts, `repeat_interleave` (uniform and per element, a zero
//! count included), `pad` in its four modes on two axes (`F.pad(x, (2, 3, 1,
//! 2))`), `pixel_shuffle`/`pixel_unshuffle`, and `interpolate` (nearest,
//! nearest-exact, bilinear with and without `align_corners`; sizes up and
//! down, integer and fractional scale factors). Each case also checks the
//! gradient of `sum(y * w)` for a fixed random `w`.
//! Tolerances: f32 rtol 1e-5 / atol 1e-6 (`F32_SUM_TOL` for gradients that
//! add several copies).

use crate::common;

use common::*;
use forma::core::ops::pad::PadMode;
use forma::core::ops::resample::{Interpolation, Resize};
use forma::core::shape::{op, Broadcasts, Shape};
use forma::core::Tensor;
use forma::{Dyn, C};

/// Runs `f` on the fixture input `input`, compares its output with
/// `<case>.out` and the gradient of `sum(y * w)` with `<case>.grad`.
fn check_case<S: Shape, S2: Shape, D: TestDevice>(
    c: &mut Checks,
    fx: &Fixture,
    dev: &D,
    input: &str,
    case: &str,
    f: impl Fn(&Tensor<S, f32, D>) -> forma::Result<Tensor<S2, f32, D>>,
) where
    S2: Broadcasts<S2, op::mul>,
{
    let x: Tensor<S, f32, D> = fx.tensor::<S, f32, D>(input, dev).requires_grad();
    let y = match f(&x) {
        Ok(y) => y,
        Err(e) => return c.fail(format!("{case}: the op failed: {e}")),
    };
    c.close(&y, &format!("{case}.out"), F32_TOL);
    let w: Tensor<S2, f32, D> = fx.tensor(&format!("{case}.w"), dev);
    (&y * &w).sum_all().backward();
    c.close(
        &x.grad().expect("a gradient"),
        &format!("{case}.grad"),
        F32_SUM_TOL,
    );
}

type M = (C<2>, C<3>, C<4>);
type V = (C<3>, C<5>);
type Img = (C<2>, C<3>, C<4>, C<5>);

device_tests! {
    fn triangles<D>(dev) {
        let fx = Fixture::load("rearrange");
        let mut c = Checks::new(&fx);
        for k in [-1i64, 0, 2] {
            check_case::<M, M, D>(&mut c, &fx, dev, "m.in0", &format!("tril.k{k}"), |x| x.try_tril(k));
            check_case::<M, M, D>(&mut c, &fx, dev, "m.in0", &format!("triu.k{k}"), |x| x.try_triu(k));
        }
        let sp: Tensor<(C<3>, C<3>), f32, D> = fx.tensor("special.in0", dev);
        c.close(&sp.tril(0), "tril.special.out", EXACT);
        c.close(&sp.triu(1), "triu.special.out", EXACT);
        c.finish();
    }

    fn roll_and_repeat<D>(dev) {
        let fx = Fixture::load("rearrange");
        let mut c = Checks::new(&fx);
        for s in [2i64, -1, 7, 0] {
            check_case::<V, V, D>(&mut c, &fx, dev, "v.in0", &format!("roll.ax1.s{s}"), |x| x.try_roll::<1>(s));
        }
        check_case::<V, V, D>(&mut c, &fx, dev, "v.in0", "roll.ax0.s1", |x| x.try_roll::<0>(1));
        check_case::<V, (C<3>, Dyn), D>(&mut c, &fx, dev, "v.in0", "repeat.ax1.r3", |x| {
            x.try_repeat_interleave::<1>(3)
        });
        check_case::<V, (Dyn, C<5>), D>(&mut c, &fx, dev, "v.in0", "repeat.ax0.each", |x| {
            x.try_repeat_interleave_each::<0>(&[2, 0, 1])
        });
        c.finish();
    }

    fn pad_modes<D>(dev) {
        let fx = Fixture::load("rearrange");
        let mut c = Checks::new(&fx);
        let modes = [
            ("constant", PadMode::Constant(1.5)),
            ("reflect", PadMode::Reflect),
            ("replicate", PadMode::Replicate),
            ("circular", PadMode::Circular),
        ];
        for (name, mode) in modes {
            check_case::<Img, (C<2>, C<3>, Dyn, Dyn), D>(&mut c, &fx, dev, "img.in0", &format!("pad.{name}"), |x| {
                x.try_pad::<3>(2, 3, mode)?.try_pad::<2>(1, 2, mode)
            });
        }
        c.finish();
    }

    fn pixel_shuffles<D>(dev) {
        let fx = Fixture::load("rearrange");
        let mut c = Checks::new(&fx);
        check_case::<(C<2>, C<8>, C<3>, C<2>), (C<2>, Dyn, Dyn, Dyn), D>(
            &mut c, &fx, dev, "ps.in0", "pixel_shuffle.r2", |x| x.try_pixel_shuffle(2),
        );
        check_case::<(C<2>, C<2>, C<4>, C<6>), (C<2>, Dyn, Dyn, Dyn), D>(
            &mut c, &fx, dev, "pu.in0", "pixel_unshuffle.r2", |x| x.try_pixel_unshuffle(2),
        );
        c.finish();
    }

    fn interpolation<D>(dev) {
        let fx = Fixture::load("rearrange");
        let mut c = Checks::new(&fx);
        let modes = [
            ("nearest", Interpolation::Nearest),
            ("nearest_exact", Interpolation::NearestExact),
            ("bilinear", Interpolation::Bilinear { align_corners: false }),
            ("bilinear_ac", Interpolation::Bilinear { align_corners: true }),
        ];
        let sizes = [
            ("size_up", Resize::Size(7, 9)),
            ("size_down", Resize::Size(3, 2)),
            ("scale2", Resize::Scale(2.0, 2.0)),
            ("scale1_7", Resize::Scale(1.7, 0.6)),
        ];
        for (mname, mode) in modes {
            for (sname, size) in sizes {
                check_case::<Img, (C<2>, C<3>, Dyn, Dyn), D>(
                    &mut c, &fx, dev, "img.in0", &format!("interp.{mname}.{sname}"),
                    |x| x.try_interpolate(size, mode),
                );
            }
        }
        c.finish();
    }

    /// PyTorch's refusals are errors, not panics.
    fn refusals<D>(dev) {
        let fx = Fixture::load("rearrange");
        let x: Tensor<Img, f32, D> = fx.tensor("img.in0", dev);
        let err = x.try_pad::<3>(5, 0, PadMode::Reflect).unwrap_err().to_string();
        assert!(err.contains("reflect padding of (5, 0) does not fit axis 3 of size 5"), "{err}");
        assert!(x.try_pad::<3>(5, 5, PadMode::Circular).is_ok());
        assert!(x.try_pad::<3>(6, 0, PadMode::Circular).is_err());
        let err = x.try_pixel_shuffle(2).unwrap_err().to_string();
        assert!(err.contains("3 channels are not a multiple of the upscale factor 2"), "{err}");
        assert!(x.try_pixel_unshuffle(3).is_err());
        assert!(x.try_interpolate(Resize::Scale(0.1, 1.0), Interpolation::Nearest).is_err());
        assert!(x.try_interpolate(Resize::Scale(f64::NAN, 1.0), Interpolation::Nearest).is_err());
        let err = x.try_repeat_interleave_each::<0>(&[1]).unwrap_err().to_string();
        assert!(err.contains("1 repeat counts for axis 0 of size 2"), "{err}");
    }
}
