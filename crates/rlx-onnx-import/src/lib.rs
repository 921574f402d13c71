//! rlx-onnx-import
