// `nll_loss` needs one class index per row of log-probabilities: 4 rows
// against 3 targets.
use forma::nn::loss::{nll_loss, Mean};
use forma::prelude::*;

fn main() {
    let log_probs = Tensor::<(C<4>, C<10>)>::zeros();
    let target = Tensor::<(C<3>,), i64>::zeros();
    let _loss = nll_loss(&log_probs, &target, Mean);
}
