//! Convolution and pooling against PyTorch (`tools/fixtures/conv.safetensors`,
//! `tools/fixtures/pool.safetensors`): `F.conv2d` with stride, padding,
//! dilation, groups (incl. depthwise), asymmetric options, 1x1 kernels, an
//! NHWC-permuted input, NaN/Inf inputs, an empty batch, f64, channel bias;
//! `F.conv1d`; `F.max_pool2d` / `F.avg_pool2d` with padding, ceil_mode,
//! dilation, count_include_pad, NaN/±Inf, a permuted input, an empty batch,
//! f64; `F.max_pool1d` / `F.avg_pool1d`; and the errors for bad options.
//! Tolerances: conv f32 rtol 1e-5 / atol 1e-5 (sums of products), max
//! pooling exact (it picks a value), average pooling rtol 1e-5 / atol 1e-6,
//! f64 1e-12.

use crate::common;

use common::*;
use forma::core::ops::conv::add_channel_bias;
use forma::core::{Error, Tensor};
use forma::{Ax, Conv2dParams, Dyn, Pool2dParams, C};

fn conv(
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Conv2dParams {
    Conv2dParams {
        stride,
        padding,
        dilation,
        groups,
    }
}

type X4<const N: usize, const CH: usize, const H: usize, const W: usize, D> =
    Tensor<(C<N>, C<CH>, C<H>, C<W>), f32, D>;

device_tests! {
    /// Every F.conv2d option set of the fixture file.
    fn conv2d_matches_torch<D>(dev) {
        let fx = Fixture::load("conv");
        let mut c = Checks::new(&fx);
        let t = F32_SUM_TOL;
        macro_rules! case {
            ($name:literal, $x:ty, $w:ty, $p:expr) => {{
                let x: $x = fx.tensor(concat!($name, ".in0"), dev);
                let w: $w = fx.tensor(concat!($name, ".in1"), dev);
                c.close_ok(x.try_conv2d(&w, $p), concat!($name, ".out"), t);
            }};
        }
        case!("basic", X4<2, 3, 5, 5, D>, X4<4, 3, 3, 3, D>, Conv2dParams::default());
        case!("stride_pad", X4<1, 2, 6, 7, D>, X4<3, 2, 3, 3, D>, conv([2, 2], [1, 1], [1, 1], 1));
        case!("dilation", X4<1, 2, 7, 7, D>, X4<2, 2, 3, 3, D>, conv([1, 1], [2, 2], [2, 2], 1));
        case!("groups", X4<1, 4, 5, 5, D>, X4<6, 2, 3, 3, D>, conv([1, 1], [0, 0], [1, 1], 2));
        case!("depthwise", X4<2, 3, 5, 5, D>, X4<3, 1, 3, 3, D>, conv([1, 1], [1, 1], [1, 1], 3));
        case!("asym", X4<1, 2, 5, 6, D>, X4<2, 2, 2, 3, D>, conv([1, 2], [2, 0], [1, 1], 1));
        case!("k1", X4<2, 3, 4, 4, D>, X4<5, 3, 1, 1, D>, Conv2dParams::default());
        // NaN and +Inf in the input: every window that sees them is NaN/Inf
        case!("nan", X4<1, 2, 5, 5, D>, X4<2, 2, 3, 3, D>, Conv2dParams::default());
        // an empty batch
        case!("empty", Tensor<(Dyn, C<3>, C<5>, C<5>), f32, D>, X4<4, 3, 3, 3, D>, Conv2dParams::default());
        c.finish();
    }

    /// The input stored NHWC [2,5,5,3] and used as `x.permute(0,3,1,2)`.
    fn conv2d_noncontiguous_input<D>(dev) {
        let fx = Fixture::load("conv");
        let x: X4<2, 5, 5, 3, D> = fx.tensor("nc.in0", dev);
        let w: X4<4, 3, 3, 3, D> = fx.tensor("nc.in1", dev);
        let x = x.permute::<(Ax<0>, Ax<3>, Ax<1>, Ax<2>)>();
        assert!(!x.is_contiguous());
        fx.check(&x.conv2d(&w, conv([1, 1], [1, 1], [1, 1], 1)), "nc.out", F32_SUM_TOL);
    }

    fn conv2d_f64<D>(dev) {
        let fx = Fixture::load("conv");
        let x: Tensor<(C<1>, C<2>, C<5>, C<5>), f64, D> = fx.tensor("f64.in0", dev);
        let w: Tensor<(C<3>, C<2>, C<3>, C<3>), f64, D> = fx.tensor("f64.in1", dev);
        fx.check(&x.conv2d(&w, conv([1, 1], [1, 1], [1, 1], 1)), "f64.out", F64_TOL);
    }

    /// `F.conv2d(x, w, b)` is `add_channel_bias(x.conv2d(w), b)`.
    fn conv2d_with_channel_bias<D>(dev) {
        let fx = Fixture::load("conv");
        let x: X4<2, 3, 4, 4, D> = fx.tensor("bias.in0", dev);
        let w: X4<4, 3, 3, 3, D> = fx.tensor("bias.in1", dev);
        let b: Tensor<(C<4>,), f32, D> = fx.tensor("bias.in2", dev);
        let y = x.conv2d(&w, conv([1, 1], [1, 1], [1, 1], 1));
        fx.check(&add_channel_bias(&y, &b), "bias.out", F32_SUM_TOL);
        let y = x.conv2d_bias(&w, Some(&b), conv([1, 1], [1, 1], [1, 1], 1));
        fx.check(&y, "bias.out", F32_SUM_TOL);
        // A `Dyn` bias of the wrong length is an error, not a panic.
        let wd: Tensor<(Dyn, C<3>, C<3>, C<3>), f32, D> = fx.tensor("bias.in1", dev);
        let short = Tensor::<(Dyn,), f32, D>::zeros_on((Dyn(3),), dev);
        let err = x.try_conv2d_bias(&wd, Some(&short), conv([1, 1], [1, 1], [1, 1], 1));
        assert!(err.unwrap_err().to_string().contains("3 biases, one per channel"));
    }

    /// `F.conv1d` with stride and padding, with dilation, with groups.
    fn conv1d_matches_torch<D>(dev) {
        let fx = Fixture::load("conv");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<2>, C<3>, C<10>), f32, D> = fx.tensor("c1.x.in0", dev);
        let w: Tensor<(C<4>, C<3>, C<3>), f32, D> = fx.tensor("c1.x.in1", dev);
        c.close_ok(x.try_conv1d(&w, 2, 1, 1, 1), "c1.x.out", F32_SUM_TOL);
        let w: Tensor<(C<2>, C<3>, C<3>), f32, D> = fx.tensor("c1.dil.in1", dev);
        c.close_ok(x.try_conv1d(&w, 1, 2, 2, 1), "c1.dil.out", F32_SUM_TOL);
        let x: Tensor<(C<1>, C<4>, C<8>), f32, D> = fx.tensor("c1.groups.in0", dev);
        let w: Tensor<(C<2>, C<2>, C<3>), f32, D> = fx.tensor("c1.groups.in1", dev);
        c.close_ok(x.try_conv1d(&w, 1, 0, 1, 2), "c1.groups.out", F32_SUM_TOL);
        c.finish();
    }

    /// Channel mismatches, groups that do not divide, kernels that do not fit.
    fn conv_errors<D>(dev) {
        let x: Tensor<(Dyn, Dyn, Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(1), Dyn(3), Dyn(5), Dyn(5)), dev);
        let w: Tensor<(Dyn, Dyn, Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(4), Dyn(2), Dyn(3), Dyn(3)), dev);
        match x.try_conv2d(&w, Conv2dParams::default()) {
            Err(Error::Shape(e)) => assert_eq!((e.op, e.actual.as_str()), ("conv2d", "[1, 3, 5, 5]")),
            other => panic!("expected a shape error, got {:?}", other.map(|t| t.dims())),
        }
        let w: Tensor<(Dyn, Dyn, Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(4), Dyn(1), Dyn(3), Dyn(3)), dev);
        assert!(matches!(
            x.try_conv2d(&w, conv([1, 1], [0, 0], [1, 1], 2)),
            Err(Error::InvalidArgument { op: "conv2d", .. })
        ));
        let w: Tensor<(Dyn, Dyn, Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(4), Dyn(3), Dyn(7), Dyn(3)), dev);
        assert!(matches!(
            x.try_conv2d(&w, Conv2dParams::default()),
            Err(Error::InvalidArgument { op: "conv2d", .. })
        ));
        // with padding 1 the 7-tall kernel fits a 5-tall input
        let w: Tensor<(Dyn, Dyn, Dyn, Dyn), f32, D> = Tensor::zeros_on((Dyn(4), Dyn(3), Dyn(7), Dyn(3)), dev);
        let y = x.try_conv2d(&w, conv([1, 1], [1, 1], [1, 1], 1)).unwrap();
        assert_eq!(y.dims().to_vec(), vec![1, 4, 1, 5]);
    }

    /// F.max_pool2d / F.avg_pool2d with the same window options.
    fn pool2d_matches_torch<D>(dev) {
        let fx = Fixture::load("pool");
        let mut c = Checks::new(&fx);
        macro_rules! both {
            ($name:literal, $x:ty, $p:expr) => {{
                let x: $x = fx.tensor(concat!($name, ".in0"), dev);
                let p: Pool2dParams = $p;
                c.close_ok(x.try_max_pool2d(p), concat!("max.", $name, ".out"), EXACT);
                c.close_ok(x.try_avg_pool2d(p), concat!("avg.", $name, ".out"), F32_TOL);
            }};
        }
        both!("k2", X4<2, 3, 6, 6, D>, Pool2dParams::new([2, 2]));
        both!("k3s2p1", X4<1, 2, 7, 7, D>, Pool2dParams { stride: [2, 2], padding: [1, 1], ..Pool2dParams::new([3, 3]) });
        both!(
            "ceil",
            X4<1, 2, 7, 7, D>,
            Pool2dParams { stride: [2, 2], padding: [1, 1], ceil_mode: true, ..Pool2dParams::new([3, 3]) }
        );
        both!("asym", X4<1, 1, 5, 7, D>, Pool2dParams { stride: [1, 2], padding: [1, 0], ..Pool2dParams::new([2, 3]) });
        // NaN, +Inf, -Inf and an all -Inf window
        both!("special", X4<1, 1, 4, 4, D>, Pool2dParams::new([2, 2]));
        both!("empty", Tensor<(Dyn, C<2>, C<4>, C<4>), f32, D>, Pool2dParams::new([2, 2]));
        c.finish();
    }

    /// Stored [2,6,6,3] and used as `x.permute(0,3,1,2)`.
    fn pool2d_noncontiguous_input<D>(dev) {
        let fx = Fixture::load("pool");
        let x: X4<2, 6, 6, 3, D> = fx.tensor("nc.in0", dev);
        let x = x.permute::<(Ax<0>, Ax<3>, Ax<1>, Ax<2>)>();
        let p = Pool2dParams::new([2, 2]);
        let mut c = Checks::new(&fx);
        c.close_ok(x.try_max_pool2d(p), "max.nc.out", EXACT);
        c.close_ok(x.try_avg_pool2d(p), "avg.nc.out", F32_TOL);
        c.finish();
    }

    fn pool2d_f64<D>(dev) {
        let fx = Fixture::load("pool");
        let x: Tensor<(C<1>, C<2>, C<6>, C<6>), f64, D> = fx.tensor("f64.in0", dev);
        let p = Pool2dParams { stride: [1, 1], padding: [1, 1], ..Pool2dParams::new([3, 3]) };
        let mut c = Checks::new(&fx);
        c.close_ok(x.try_max_pool2d(p), "max.f64.out", EXACT);
        c.close_ok(x.try_avg_pool2d(p), "avg.f64.out", F64_TOL);
        c.finish();
    }

    /// Dilated max pooling; average pooling without padded zeros in the
    /// divisor, and the divisor of clipped ceil-mode windows.
    fn pool2d_dilation_and_divisors<D>(dev) {
        let fx = Fixture::load("pool");
        let mut c = Checks::new(&fx);
        let x: X4<1, 2, 7, 7, D> = fx.tensor("dil.in0", dev);
        let p = Pool2dParams { stride: [1, 1], padding: [1, 1], dilation: [2, 2], ..Pool2dParams::new([3, 3]) };
        c.close_ok(x.try_max_pool2d(p), "max.dil.out", EXACT);
        let x: X4<1, 2, 5, 5, D> = fx.tensor("nopad.in0", dev);
        let p = Pool2dParams { stride: [2, 2], padding: [1, 1], count_include_pad: false, ..Pool2dParams::new([3, 3]) };
        c.close_ok(x.try_avg_pool2d(p), "avg.nopad.out", F32_TOL);
        let p = Pool2dParams { padding: [1, 1], ceil_mode: true, count_include_pad: false, ..Pool2dParams::new([2, 2]) };
        c.close_ok(x.try_avg_pool2d(p), "avg.nopad_ceil.out", F32_TOL);
        let p = Pool2dParams { padding: [1, 1], ceil_mode: true, ..Pool2dParams::new([2, 2]) };
        c.close_ok(x.try_avg_pool2d(p), "avg.pad_ceil.out", F32_TOL);
        c.finish();
    }

    /// F.max_pool1d / F.avg_pool1d(x, kernel, stride, padding).
    fn pool1d_matches_torch<D>(dev) {
        let fx = Fixture::load("pool");
        let mut c = Checks::new(&fx);
        let x: Tensor<(C<2>, C<3>, C<10>), f32, D> = fx.tensor("p1.in0", dev);
        c.close_ok(x.try_max_pool1d(3, 2, 1), "max1.k3s2p1.out", EXACT);
        c.close_ok(x.try_avg_pool1d(3, 2, 1), "avg1.k3s2p1.out", F32_TOL);
        c.close_ok(x.try_max_pool1d(2, 2, 0), "max1.k2.out", EXACT);
        c.close_ok(x.try_avg_pool1d(2, 2, 0), "avg1.k2.out", F32_TOL);
        c.finish();
    }

    /// Padding over half the window, a zero window, a window larger than the input.
    fn pool_errors<D>(dev) {
        let x: X4<1, 1, 4, 4, D> = Tensor::zeros_on((C, C, C, C), dev);
        let p = Pool2dParams { padding: [2, 2], ..Pool2dParams::new([3, 3]) };
        assert!(matches!(x.try_max_pool2d(p), Err(Error::InvalidArgument { op: "max_pool2d", .. })));
        assert!(matches!(x.try_avg_pool2d(p), Err(Error::InvalidArgument { op: "avg_pool2d", .. })));
        assert!(x.try_max_pool2d(Pool2dParams::new([0, 2])).is_err());
        assert!(x.try_max_pool2d(Pool2dParams::new([5, 5])).is_err());
        let x1: Tensor<(C<1>, C<1>, C<4>), f32, D> = Tensor::zeros_on((C, C, C), dev);
        assert!(x1.try_avg_pool1d(5, 1, 0).is_err());
    }
}

/// In inference a convolution with few output positions per image reads
/// its weight packed once, kept while the weight is unwritten: the outputs
/// are a taped call's bits (which packs nothing), over runs of stacked
/// images and strides, and a weight written in place is packed again.
#[test]
fn inference_reuses_a_packed_conv_weight_until_it_is_written() {
    use forma::core::ops::packed_weights::holds_packed;
    use forma::core::tape::no_grad;
    type T<S> = forma::core::Tensor<S, f32, forma::Cpu>;
    let mut rng = forma::Rng::seed_from(43);
    let bits =
        |t: T<(Dyn, C<40>, Dyn, Dyn)>| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    // 13 images of 10x20 positions: two stacked runs (11 and 2 images).
    let x = T::<(Dyn, C<8>, C<10>, C<20>)>::randn((Dyn(13), C, C, C), &mut rng);
    let w2 = T::<(C<40>, C<8>, C<3>, C<3>)>::randn((C, C, C, C), &mut rng);
    for p in [
        conv([1, 1], [1, 1], [1, 1], 1),
        conv([2, 1], [0, 2], [1, 2], 1),
    ] {
        let w = T::<(C<40>, C<8>, C<3>, C<3>)>::randn((C, C, C, C), &mut rng);
        let taped =
            |w: &T<(C<40>, C<8>, C<3>, C<3>)>| bits(x.conv2d(&w.detach().requires_grad(), p));
        let inference = |w: &T<(C<40>, C<8>, C<3>, C<3>)>| {
            let _g = no_grad();
            bits(x.conv2d(w, p))
        };
        let want = taped(&w);
        assert!(inference(&w) == want, "{p:?}: first inference call");
        assert!(holds_packed(&w), "{p:?}: packed on the first call");
        assert!(inference(&w) == want, "{p:?}: on the packed weight");
        w.assign(&w2);
        assert!(!holds_packed(&w), "{p:?}: a written weight's copy is stale");
        let want2 = taped(&w2);
        assert!(want2 != want);
        assert!(
            inference(&w) == want2,
            "{p:?}: after the weight was written"
        );
    }
    // Many positions per image: the weight is read as it is, not kept.
    let big = T::<(Dyn, C<8>, C<20>, C<20>)>::randn((Dyn(2), C, C, C), &mut rng);
    let _g = no_grad();
    let _ = big.conv2d(&w2, conv([1, 1], [0, 0], [1, 1], 1));
    assert!(!holds_packed(&w2));
}
