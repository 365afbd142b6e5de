// GroupNorm with 3 groups over 8 channels: the groups must divide the channels.
use forma::nn::layers::GroupNorm;
use forma::prelude::*;

fn main() {
    let _gn = GroupNorm::<3, 8>::new(&Cpu);
}
