//! One file per op family, each implementing its kernel trait from
//! `forma_core::ops` for [`crate::Cpu`].

mod attention;
#[cfg(target_arch = "x86_64")]
mod bgemm;
mod binary;
mod cmp;
mod conv;
mod cumsum;
mod fused;
mod fused_nodes;
mod index;
mod linear;
mod matmul;
mod norm;
mod pool;
mod reduce;
mod rnn;
#[cfg(target_arch = "x86_64")]
mod sdot;
#[cfg(target_arch = "x86_64")]
mod sgemm;
mod softmax;
#[cfg(target_arch = "x86_64")]
mod srow;
mod unary;
mod update;
