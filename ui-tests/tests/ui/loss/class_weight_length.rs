// A class weight of 9 values for logits over 10 classes: the weight has one
// value per class (PyTorch raises when the loss runs; here it is a compile
// error when both sizes are static).
use forma::nn::loss::CrossEntropyLoss;
use forma::prelude::*;

fn main() {
    let logits = Tensor::<(Dyn, C<10>)>::zeros_with((Dyn(4), C));
    let labels = Tensor::<(Dyn,), i64>::zeros_with((Dyn(4),));
    let weight = Tensor::<(C<9>,)>::ones();
    let _loss = CrossEntropyLoss::new().weight(&weight).forward(&logits, &labels);
}
