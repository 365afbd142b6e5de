//! Forma's integration tests, as one test binary: one module per area (the
//! file of the same name). One binary compiles and links the library's
//! generic code once rather than once per file, which keeps CI's build short.
//! Tests that need a process of their own (`tape_memory`, whose counters are
//! process-wide) and the CUDA suite (`cuda_ops`) stay separate binaries.
//!
//! Run one area with `cargo test --test suite ops_softmax::`.

#[path = "../common/mod.rs"]
mod common;

mod amp_parity;
mod autograd;
mod autograd_hooks;
mod autograd_inplace;
mod checkpoint_hostile;
mod checkpoint_lenient;
mod checkpoint_resume;
mod compile;
mod display;
mod grad_composite;
mod grad_ops;
mod graph_capture;
mod module_forward;
mod module_retype;
mod nn_data;
mod nn_init;
mod nn_layer_parity;
mod nn_layers;
mod nn_loss_parity;
mod nn_optim_parity;
mod nn_seq_parity;
mod nn_train_parity;
mod ops_attention;
mod ops_binary;
mod ops_cmp;
mod ops_conv_pool;
mod ops_create;
mod ops_cumsum;
mod ops_einsum;
mod ops_fused;
mod ops_index;
mod ops_int_reduce;
mod ops_linear;
mod ops_matmul;
mod ops_norm;
mod ops_rearrange;
mod ops_reduce;
mod ops_rnn;
mod ops_shape;
mod ops_softmax;
mod ops_sort;
mod ops_unary;
mod shape_soundness;
