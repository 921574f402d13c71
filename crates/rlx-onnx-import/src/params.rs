//! Which op inputs are *parameter* inputs: inputs whose value only fixes sizes, axes or
//! attributes of the computation (what older opsets had as attributes), so a runtime may
//! specialize a plan on their values and still compute the op. Anything else is a *data*
//! input: its values flow into the output's values or decide them element by element.
//!
//! The rule, from the ONNX operator schemas (onnx 1.23 `docs/Operators.md`): an input is a
//! parameter input when the op's definition uses its value only to fix sizes, axes or
//! attributes: it selects, counts or shapes, and never enters the arithmetic of an output
//! value. An input not in [`PARAMETER_INPUTS`] counts as data, so an op missing from the
//! table errs toward "data". Used by dynamic models (`rlx_runtime::dynamic`, which plan per
//! value of such an input when the importer needs it) and by the conformance harness (which
//! reports cases apart by what their frozen inputs are).

/// Parameter inputs: `(op type, schema input index, schema input name)`. Grouped by why.
pub const PARAMETER_INPUTS: &[(&str, usize, &str)] = &[
    // Axes: which dimensions the op works along.
    ("ReduceSum", 1, "axes"),
    ("ReduceMean", 1, "axes"),
    ("ReduceMax", 1, "axes"),
    ("ReduceMin", 1, "axes"),
    ("ReduceProd", 1, "axes"),
    ("ReduceL1", 1, "axes"),
    ("ReduceL2", 1, "axes"),
    ("ReduceLogSum", 1, "axes"),
    ("ReduceLogSumExp", 1, "axes"),
    ("ReduceSumSquare", 1, "axes"),
    ("Squeeze", 1, "axes"),
    ("Unsqueeze", 1, "axes"),
    ("CumSum", 1, "axis"),
    ("CumProd", 1, "axis"),
    ("DFT", 2, "axis"),
    ("Slice", 3, "axes"),
    ("Pad", 3, "axes"),
    // Output or block sizes: the value fixes a shape; every output value is still computed
    // from the data input.
    ("Reshape", 1, "shape"),
    ("Expand", 1, "shape"),
    ("Tile", 1, "repeats"),
    ("Split", 1, "split"),
    ("SplitToSequence", 1, "split"),
    ("CenterCropPad", 1, "shape"),
    ("Col2Im", 1, "image_shape"),
    ("Col2Im", 2, "block_shape"),
    ("MaxUnpool", 2, "output_shape"),
    // AffineGrid's size fixes the output grid (N, H, W); the base grid it implies is a
    // function of the size alone, as an attribute's would be, and theta (data) still goes
    // through the runtime.
    ("AffineGrid", 1, "size"),
    ("ConstantOfShape", 0, "input"),
    ("DFT", 1, "dft_length"),
    ("TopK", 1, "K"),
    ("OneHot", 1, "depth"),
    ("STFT", 1, "frame_step"),
    ("STFT", 3, "frame_length"),
    // Range's limit only fixes the count, max(ceil((limit - start) / delta), 0); start and
    // delta are data: every output value is start + i * delta.
    ("Range", 1, "limit"),
    // Which elements are read: slice bounds and steps, pads (the pad *value* is data: it is
    // written into the output).
    ("Slice", 1, "starts"),
    ("Slice", 2, "ends"),
    ("Slice", 4, "steps"),
    ("Pad", 1, "pads"),
    // Resampling geometry: the sizes/scales fix the output shape and the coordinate map,
    // roi the crop box of `tf_crop_and_resize`; the output values interpolate X.
    ("Resize", 1, "roi"),
    ("Resize", 2, "scales"),
    ("Resize", 3, "sizes"),
    ("Upsample", 1, "scales"),
    // Limits and thresholds of NonMaxSuppression (boxes and scores are data).
    ("NonMaxSuppression", 2, "max_output_boxes_per_class"),
    ("NonMaxSuppression", 3, "iou_threshold"),
    ("NonMaxSuppression", 4, "score_threshold"),
    // A position in a sequence: selects, computes nothing.
    ("SequenceAt", 1, "position"),
    ("SequenceErase", 1, "position"),
    ("SequenceInsert", 2, "position"),
];
// Data inputs that look like parameters, and why they are data:
// * Range's start and delta, the window ops' size (HannWindow, HammingWindow,
//   BlackmanWindow: N enters cos(2 pi n / N)), MelWeightMatrix's five inputs (bins, length,
//   rate and edges place the triangles' values): the output's values are computed from them,
//   so freezing them all computes the op at import time.
// * OneHot's values, Pad's constant_value: written into the output.
// * NonZero's X, Compress's condition, Unique's X, If's cond, Loop's trip count and cond:
//   they decide element by element (or branch by branch, iteration by iteration) what the
//   output holds.

/// Whether `op`'s input number `index` is a parameter input ([`PARAMETER_INPUTS`]).
pub fn is_parameter_input(op: &str, index: usize) -> bool {
    PARAMETER_INPUTS
        .iter()
        .any(|&(o, i, _)| o == op && i == index)
}
