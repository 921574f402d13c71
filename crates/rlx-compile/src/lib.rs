//! RLX compiler passes, one file each; [`compiler`] runs them in order.

pub mod infer_shape;
