//! Optimizers (SGD, Adam, AdamW, RMSprop, Adagrad) with parameter groups, and
//! gradient clipping.
