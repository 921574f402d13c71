"""Small ONNX models with named input dims (batch, seq) whose shape arithmetic goes through
Shape/Gather/Concat/Reshape/Slice/Expand/Range/ConstantOfShape/Unsqueeze/Squeeze/Flatten/
Where/Equal/Split, and images through ceil_mode pooling, SAME convs, an opset-11 Softmax
and an opset-12 Dropout mask: seeds for the onnx_model fuzz target's symbolic import (rlx
sym.rs, ops/shape_sym.rs, ops/nn.rs). Usage: python gen_onnx_model_sym_seeds.py OUT_DIR"""
import os, sys
import numpy as np
import onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
F, I = T.FLOAT, T.INT64


def c(name, arr, dt=np.int64):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(arr, dtype=dt), name))


def toposort(nodes, known):
    known, done, out = set(known), set(), []
    while len(out) < len(nodes):
        for i, n in enumerate(nodes):
            if i not in done and all(x in known for x in n.input if x):
                out.append(n); done.add(i); known.update(n.output)
                break
        else:
            raise ValueError("cycle or missing input")
    return out


def save(name, nodes, inputs, outputs, opset=17, inits=()):
    nodes = toposort(nodes, [i.name for i in inputs] + [t.name for t in inits])
    g = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    # Outputs are declared without a shape, which the checker refuses; strict shape
    # inference checks the graph instead (the model is saved without what it infers).
    onnx.shape_inference.infer_shapes(m, strict_mode=True)
    onnx.save(m, os.path.join(out, f"sym_{name}.onnx"))


x_bs4 = h.make_tensor_value_info("x", F, ["batch", "seq", 4])
x_bs = h.make_tensor_value_info("x", F, ["batch", "seq"])
ids = h.make_tensor_value_info("ids", I, ["batch", "seq"])
y = lambda dt=F: h.make_tensor_value_info("y", dt, None)

# 1. Shape -> Gather(batch), Gather(seq) -> Concat -> Reshape to [batch*seq, 4] via -1
save("reshape_flat", [
    h.make_node("Shape", ["x"], ["s"]),
    c("i0", 0), c("i1", 1), c("m1", [-1]), c("four", [4]),
    h.make_node("Gather", ["s", "i0"], ["b"]),
    h.make_node("Gather", ["s", "i1"], ["q"]),
    h.make_node("Mul", ["b", "q"], ["bq"]),
    h.make_node("Unsqueeze", ["bq", "ax0"], ["bq1"]),
    c("ax0", [0]),
    h.make_node("Concat", ["bq1", "four"], ["shp"], axis=0),
    h.make_node("Reshape", ["x", "shp"], ["y"]),
], [x_bs4], [y()])

# 2. Shape slice [0:2] concat [2,2] -> Reshape (split last dim)
save("shape_slice_reshape", [
    h.make_node("Shape", ["x"], ["s"]),
    c("st", [0]), c("en", [2]), c("ax", [0]), c("tail", [2, 2]),
    h.make_node("Slice", ["s", "st", "en", "ax"], ["bs"]),
    h.make_node("Concat", ["bs", "tail"], ["shp"], axis=0),
    h.make_node("Reshape", ["x", "shp"], ["y"]),
], [x_bs4], [y()])

# 3. Range(0, seq) -> Unsqueeze -> Expand to [batch, seq] (position ids)
save("range_expand_positions", [
    h.make_node("Shape", ["ids"], ["s"]),
    c("i1", 1), c("z", 0), c("one", 1), c("ax0", [0]),
    h.make_node("Gather", ["s", "i1"], ["q"]),
    h.make_node("Range", ["z", "q", "one"], ["r"]),
    h.make_node("Unsqueeze", ["r", "ax0"], ["r1"]),
    h.make_node("Expand", ["r1", "s"], ["y"]),
], [ids], [y(I)])

# 4. ConstantOfShape(Shape(x)) + Equal/Where mask
save("constofshape_where", [
    h.make_node("Shape", ["x"], ["s"]),
    h.make_node("ConstantOfShape", ["s"], ["zeros"], value=nh.from_array(np.array([0.0], np.float32))),
    c("thr", 0.0, np.float32),
    h.make_node("Equal", ["x", "zeros"], ["eq"]),
    c("ninf", -1e9, np.float32),
    h.make_node("Where", ["eq", "ninf", "x"], ["y"]),
], [x_bs], [y()])

# 5. Causal mask: Range(seq) compare -> Where, ConstantOfShape([seq, seq])
save("causal_mask", [
    h.make_node("Shape", ["x"], ["s"]),
    c("i1", [1]), c("z", 0), c("one", 1),
    h.make_node("Gather", ["s", "i1"], ["q1"]),
    h.make_node("Squeeze", ["q1"], ["q"]),
    h.make_node("Concat", ["q1", "q1"], ["qq"], axis=0),
    h.make_node("ConstantOfShape", ["qq"], ["full"], value=nh.from_array(np.array([1.0], np.float32))),
    h.make_node("Range", ["z", "q", "one"], ["r"]),
    h.make_node("Unsqueeze", ["r", "a1"], ["rc"]), c("a1", [1]),
    h.make_node("Unsqueeze", ["r", "a0"], ["rr"]), c("a0", [0]),
    h.make_node("Greater", ["rr", "rc"], ["up"]),
    c("zero_f", 0.0, np.float32),
    h.make_node("Where", ["up", "zero_f", "full"], ["y"]),
], [x_bs], [y()])

# 6. Flatten + Split into batch pieces along seq
save("flatten_split", [
    h.make_node("Flatten", ["x"], ["f"], axis=1),
    h.make_node("Split", ["x", "sp"], ["a", "b"], axis=2),
    c("sp", [1, 3]),
    h.make_node("Shape", ["f"], ["sf"]),
    h.make_node("Cast", ["sf"], ["y"], to=F),
], [x_bs4], [y(), h.make_tensor_value_info("a", F, None), h.make_tensor_value_info("b", F, None)])

# 7. Split without sizes (opset 18 num_outputs) on a symbolic axis
save("split_symbolic_axis", [
    h.make_node("Split", ["x"], ["y", "z"], axis=1, num_outputs=2),
], [x_bs4], [y(), h.make_tensor_value_info("z", F, None)], opset=18)

# 8. Shape(start,end) attrs (opset 15), Squeeze, Expand with broadcasting of [1, seq]
save("shape_attr_expand", [
    h.make_node("Shape", ["x"], ["sq"], start=1, end=2),
    h.make_node("Shape", ["x"], ["sb"], end=1),
    c("one", [1]),
    h.make_node("Concat", ["sb", "one", "sq"], ["shp"], axis=0),
    h.make_node("Unsqueeze", ["x", "ax"], ["x1"]), c("ax", [1]),
    h.make_node("Reshape", ["x", "shp"], ["r"]),
    h.make_node("Expand", ["r", "shp"], ["y"]),
], [x_bs], [y()], opset=15)

# 9. Attention-ish reshape: [b, s, 4] -> [b, s, 2, 2] -> Transpose -> [b, 2, s, 2] -> back
save("heads_reshape", [
    h.make_node("Shape", ["x"], ["s"]),
    c("i0", [0]), c("i1", [1]), c("hd", [2, 2]), c("hid", [4]),
    h.make_node("Gather", ["s", "i0"], ["b"]),
    h.make_node("Gather", ["s", "i1"], ["q"]),
    h.make_node("Concat", ["b", "q", "hd"], ["s4"], axis=0),
    h.make_node("Reshape", ["x", "s4"], ["x4"]),
    h.make_node("Transpose", ["x4"], ["t"], perm=[0, 2, 1, 3]),
    h.make_node("MatMul", ["t", "tT"], ["sc"]),
    h.make_node("Transpose", ["t"], ["tT"], perm=[0, 1, 3, 2]),
    h.make_node("Softmax", ["sc"], ["p"], axis=-1),
    h.make_node("MatMul", ["p", "t"], ["o"]),
    h.make_node("Transpose", ["o"], ["o2"], perm=[0, 2, 1, 3]),
    h.make_node("Concat", ["b", "q", "hid"], ["s3"], axis=0),
    h.make_node("Reshape", ["o2", "s3"], ["y"]),
], [x_bs4], [y()])

# 10. Slice with symbolic end (last token): x[:, seq-1:seq]
save("slice_last_token", [
    h.make_node("Shape", ["x"], ["s"]),
    c("i1", [1]), c("one", [1]), c("ax", [1]),
    h.make_node("Gather", ["s", "i1"], ["q"]),
    h.make_node("Sub", ["q", "one"], ["qm1"]),
    h.make_node("Slice", ["x", "qm1", "q", "ax"], ["y"]),
], [x_bs4], [y()])

# 11. KV cache: past [batch, 2, past, 2] concat new along seq, Shape arithmetic past+seq
past = h.make_tensor_value_info("past", F, ["batch", 2, "past", 2])
xk = h.make_tensor_value_info("x", F, ["batch", 2, "seq", 2])
save("kv_concat_total", [
    h.make_node("Concat", ["past", "x"], ["kv"], axis=2),
    h.make_node("Shape", ["past"], ["sp"]), h.make_node("Shape", ["x"], ["sx"]),
    c("i2", 2), c("z", 0), c("one", 1),
    h.make_node("Gather", ["sp", "i2"], ["p"]),
    h.make_node("Gather", ["sx", "i2"], ["q"]),
    h.make_node("Add", ["p", "q"], ["tot"]),
    h.make_node("Range", ["p", "tot", "one"], ["pos"]),
    h.make_node("Cast", ["pos"], ["posf"], to=F),
    h.make_node("Mul", ["kv", "sc"], ["y"]), c("sc", 2.0, np.float32),
], [past, xk], [y(), h.make_tensor_value_info("posf", F, None)])

# 12. Div/Mod of symbolic dims (seq // 2) -> Reshape [batch, seq/2, 8]
save("div_reshape", [
    h.make_node("Shape", ["x"], ["s"]),
    c("i0", [0]), c("i1", [1]), c("two", [2]), c("eight", [8]),
    h.make_node("Gather", ["s", "i0"], ["b"]),
    h.make_node("Gather", ["s", "i1"], ["q"]),
    h.make_node("Div", ["q", "two"], ["h"]),
    h.make_node("Concat", ["b", "h", "eight"], ["shp"], axis=0),
    h.make_node("Reshape", ["x", "shp"], ["y"]),
], [x_bs4], [y()])

# 13. Reshape with 0 (copy dim) and -1, then Squeeze/Unsqueeze round trip
save("reshape_zero_neg", [
    c("shp", [0, -1]),
    h.make_node("Reshape", ["x", "shp"], ["r"]),
    h.make_node("Unsqueeze", ["r", "ax"], ["u"]), c("ax", [0, 3]),
    h.make_node("Squeeze", ["u", "ax"], ["y"]),
], [x_bs4], [y()])

# 14. Gather of embeddings by ids + Where(ids == pad)
emb = nh.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "emb")
save("embed_pad_mask", [
    h.make_node("Gather", ["emb", "ids"], ["e"]),
    c("pad", 0),
    h.make_node("Equal", ["ids", "pad"], ["m"]),
    h.make_node("Unsqueeze", ["m", "ax"], ["m1"]), c("ax", [2]),
    c("z", 0.0, np.float32),
    h.make_node("Where", ["m1", "z", "e"], ["y"]),
], [ids], [y()], inits=[emb])

# 15. ConstantOfShape of Concat([batch], Shape(x)[1:]) + Tile on a symbolic dim
save("const_concat_tile", [
    h.make_node("Shape", ["x"], ["s"]),
    c("st", [1]), c("en", [3]),
    h.make_node("Slice", ["s", "st", "en"], ["tail"]),
    c("one", [1]),
    h.make_node("Concat", ["one", "tail"], ["shp"], axis=0),
    h.make_node("ConstantOfShape", ["shp"], ["o"], value=nh.from_array(np.array([1.0], np.float32))),
    h.make_node("Shape", ["x"], ["s0"], end=1),
    c("ones2", [1, 1]),
    h.make_node("Concat", ["s0", "ones2"], ["reps"], axis=0),
    h.make_node("Tile", ["o", "reps"], ["t"]),
    h.make_node("Add", ["t", "x"], ["y"]),
], [x_bs4], [y()])

# 16. Range with float start and symbolic limit, Expand to shape from ConstantOfShape
save("range_float_expand", [
    h.make_node("Shape", ["x"], ["s"]),
    c("i1", 1), c("i0", [0]),
    h.make_node("Gather", ["s", "i1"], ["q"]),
    h.make_node("Cast", ["q"], ["qf"], to=F),
    c("zf", 0.0, np.float32), c("hf", 0.5, np.float32),
    h.make_node("Range", ["zf", "qf", "hf"], ["r"]),
    h.make_node("Shape", ["r"], ["rs"]),
    h.make_node("Gather", ["s", "i0"], ["b"]),
    h.make_node("Concat", ["b", "rs"], ["shp"], axis=0),
    h.make_node("Expand", ["r", "shp"], ["y"]),
], [x_bs], [y()])
# 17-20 (stop 48): the window and coercion rules made symbolic then. An image with symbolic
# height/width through ceil_mode pooling, SAME convs (stride 1 symbolic; stride 2 tainted),
# an opset-11 Softmax coerced to 2-D, and an opset-12 Dropout with its mask used.
img = h.make_tensor_value_info("x", F, ["batch", 3, "h", "w"])
w3 = nh.from_array(np.full((4, 3, 3, 3), 0.1, np.float32), "w3")
save("pool_ceil_mode", [
    h.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1),
    h.make_node("AveragePool", ["p"], ["y"], kernel_shape=[2, 2], strides=[3, 3], ceil_mode=1),
], [img], [y()])
save("conv_same", [
    h.make_node("Conv", ["x", "w3"], ["a"], auto_pad="SAME_UPPER"),
    h.make_node("Conv", ["a", "w4"], ["y"], auto_pad="SAME_LOWER", strides=[2, 2], kernel_shape=[2, 2]),
], [img], [y()], inits=[w3, nh.from_array(np.full((2, 4, 2, 2), 0.2, np.float32), "w4")])
save("softmax_opset11", [
    h.make_node("Softmax", ["x"], ["y"], axis=1),
], [x_bs4], [y()], opset=11)
save("dropout_mask", [
    h.make_node("Dropout", ["x"], ["d", "m"]),
    h.make_node("Cast", ["m"], ["mf"], to=F),
    h.make_node("Add", ["d", "mf"], ["y"]),
], [x_bs4], [y()], opset=12)
print(len(os.listdir(out)), "models in", out)
