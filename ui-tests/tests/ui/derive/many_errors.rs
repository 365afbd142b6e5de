// Several mistakes in one struct are all reported at once, and the struct
// still implements `Module`, so using it adds no error of its own.
use forma::prelude::*;

#[derive(Module)]
#[module(nmae = "Network")]
struct Net {
    #[module(rnme = "proj")]
    fc1: Tensor<(C<4>, C<4>)>,
    #[module(skip, buffer)]
    fc2: Tensor<(C<4>, C<4>)>,
    #[module(buffer(persistent = "no"))]
    mean: Tensor<(C<4>,)>,
    #[module(rename = "mean")]
    var: Tensor<(C<4>,)>,
}

fn main() {
    let net = Net {
        fc1: Tensor::zeros(),
        fc2: Tensor::zeros(),
        mean: Tensor::zeros(),
        var: Tensor::zeros(),
    };
    let _ = net.state_dict();
}
