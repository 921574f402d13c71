//! Reading a `torch.save`d state dict (a dict of tensors) without Python: the weights of
//! torch.export's older archives (`serialized_state_dict.pt`, `data/weights/<model>.pt`).
//!
//! `torch.save` writes a zip: `<name>/data.pkl` (a pickle, protocol 2) and one raw
//! little-endian storage per tensor, `<name>/data/<key>`. The pickle is read by a small
//! restricted unpickler that only knows the opcodes `torch.save` emits for a dict of tensors
//! and Parameters, and only the globals that rebuild them (`torch._utils._rebuild_tensor_v2`,
//! `_rebuild_parameter`, `collections.OrderedDict`, the `torch.*Storage` types); anything
//! else (another global, an unknown opcode) is refused with an error naming it. Nothing is
//! ever executed or imported. No crate fits: `serde-pickle` has no persistent ids (which
//! name the storages) and drops the arguments of unknown globals; `repugnant-pickle` is an
//! unmaintained 0.0.1; candle's reader comes with all of candle-core.

use std::collections::HashMap;
use std::io::{Cursor, Read};

/// One tensor of the state dict: a view (sizes, strides, offset, in elements) of a storage.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedTensor {
    /// torch `ScalarType` code (as in the program's `tensor_meta`).
    pub dtype: i64,
    /// The storage's key: its bytes are `<name>/data/<key>`.
    pub key: String,
    pub offset: i64,
    pub sizes: Vec<i64>,
    pub strides: Vec<i64>,
}

/// A state dict: names → tensor views, and the storages' bytes by key.
#[derive(Debug, Default)]
pub struct StateDict {
    pub tensors: Vec<(String, SavedTensor)>,
    pub storages: HashMap<String, Vec<u8>>,
}

#[derive(Debug, Clone)]
enum Val {
    None,
    Bool,
    Int(i64),
    Float,
    Str(String),
    Tuple(Vec<Val>),
    List(Vec<Val>),
    Dict(Vec<(Val, Val)>),
    /// `module.name` of an allowed global.
    Global(String),
    /// A persistent id: a storage of this dtype, key and element count.
    Storage {
        dtype: i64,
        key: String,
        numel: i64,
    },
    Tensor(SavedTensor),
    Mark,
}

impl Val {
    fn kind(&self) -> &'static str {
        match self {
            Val::None => "None",
            Val::Bool => "a bool",
            Val::Int(_) => "an int",
            Val::Float => "a float",
            Val::Str(_) => "a string",
            Val::Tuple(_) => "a tuple",
            Val::List(_) => "a list",
            Val::Dict(_) => "a dict",
            Val::Global(_) => "a global",
            Val::Storage { .. } => "a storage",
            Val::Tensor(_) => "a tensor",
            Val::Mark => "a mark",
        }
    }
    /// How many values it holds (itself included): what a memo get copies.
    fn weight(&self) -> usize {
        match self {
            Val::Tuple(v) | Val::List(v) => 1 + v.iter().map(Val::weight).sum::<usize>(),
            Val::Dict(v) => {
                1 + v
                    .iter()
                    .map(|(k, x)| k.weight() + x.weight())
                    .sum::<usize>()
            }
            Val::Tensor(t) => 1 + t.sizes.len() + t.strides.len(),
            _ => 1,
        }
    }
}

/// Deepest nesting of containers accepted (a state dict needs 4): deeper values could
/// overflow the stack when walked or dropped.
const MAX_DEPTH: usize = 32;

/// Whether `v` nests at most `left` containers deep. Checked on every value put into a
/// container, so each walk stops at `MAX_DEPTH` and every value is walked once per level.
fn shallow(v: &Val, left: usize) -> bool {
    match v {
        Val::Tuple(xs) | Val::List(xs) => left > 0 && xs.iter().all(|x| shallow(x, left - 1)),
        Val::Dict(xs) => {
            left > 0
                && xs
                    .iter()
                    .all(|(k, x)| shallow(k, left - 1) && shallow(x, left - 1))
        }
        _ => true,
    }
}

fn nest<'v>(items: impl IntoIterator<Item = &'v Val>, at: usize) -> Result<(), String> {
    for v in items {
        if !shallow(v, MAX_DEPTH - 1) {
            return Err(format!(
                "values nested more than {MAX_DEPTH} deep at byte {at}: not a state dict"
            ));
        }
    }
    Ok(())
}

/// `torch.<Name>Storage` → `ScalarType` code.
fn storage_dtype(name: &str) -> Option<i64> {
    Some(match name {
        "ByteStorage" => 1,
        "CharStorage" => 2,
        "ShortStorage" => 3,
        "IntStorage" => 4,
        "LongStorage" => 5,
        "HalfStorage" => 6,
        "FloatStorage" => 7,
        "DoubleStorage" => 8,
        "BoolStorage" => 12,
        "BFloat16Storage" => 13,
        _ => return None,
    })
}

const ALLOWED_GLOBALS: &[&str] = &[
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
    "collections.OrderedDict",
];

fn ints(v: &Val, what: &str) -> Result<Vec<i64>, String> {
    match v {
        Val::Tuple(xs) | Val::List(xs) => xs
            .iter()
            .map(|x| match x {
                Val::Int(i) => Ok(*i),
                o => Err(format!("{what} holds {}, not an int", o.kind())),
            })
            .collect(),
        o => Err(format!("{what} is {}, not a tuple of ints", o.kind())),
    }
}

/// Apply an allowed global to its arguments.
fn reduce(f: &str, args: Vec<Val>) -> Result<Val, String> {
    match f {
        "collections.OrderedDict" => {
            if args.is_empty() {
                Ok(Val::Dict(vec![]))
            } else {
                Err("collections.OrderedDict called with arguments".into())
            }
        }
        "torch._utils._rebuild_tensor_v2" => {
            if args.len() < 4 {
                return Err(format!(
                    "_rebuild_tensor_v2 with {} arguments (wants at least 4)",
                    args.len()
                ));
            }
            let Val::Storage { dtype, key, numel } = &args[0] else {
                return Err(format!(
                    "_rebuild_tensor_v2 of {}, not a storage",
                    args[0].kind()
                ));
            };
            let Val::Int(offset) = args[1] else {
                return Err(format!(
                    "_rebuild_tensor_v2: storage offset is {}",
                    args[1].kind()
                ));
            };
            let sizes = ints(&args[2], "_rebuild_tensor_v2 size")?;
            let strides = ints(&args[3], "_rebuild_tensor_v2 stride")?;
            if sizes.len() != strides.len()
                || sizes.iter().chain(&strides).any(|&x| x < 0)
                || offset < 0
            {
                return Err(format!(
                    "bad tensor view: sizes {sizes:?}, strides {strides:?}, offset {offset}"
                ));
            }
            let _ = numel;
            Ok(Val::Tensor(SavedTensor {
                dtype: *dtype,
                key: key.clone(),
                offset,
                sizes,
                strides,
            }))
        }
        "torch._utils._rebuild_parameter" | "torch._utils._rebuild_parameter_with_state" => {
            match args.into_iter().next() {
                Some(t @ Val::Tensor(_)) => Ok(t),
                Some(o) => Err(format!("{f} of {}, not a tensor", o.kind())),
                None => Err(format!("{f} without arguments")),
            }
        }
        other => Err(format!("global {other} is not allowed")),
    }
}

struct Reader<'a> {
    d: &'a [u8],
    p: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .p
            .checked_add(n)
            .filter(|&e| e <= self.d.len())
            .ok_or_else(|| format!("truncated at byte {} (wants {n} more bytes)", self.p))?;
        let s = &self.d[self.p..end];
        self.p = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn line(&mut self) -> Result<String, String> {
        let rest = &self.d[self.p..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| format!("unterminated line at byte {}", self.p))?;
        let s = std::str::from_utf8(&rest[..n])
            .map_err(|_| format!("non-UTF-8 text at byte {}", self.p))?
            .to_string();
        self.p += n + 1;
        Ok(s)
    }
    fn utf8(&mut self, n: usize) -> Result<String, String> {
        let at = self.p;
        std::str::from_utf8(self.take(n)?)
            .map(str::to_string)
            .map_err(|_| format!("non-UTF-8 string at byte {at}"))
    }
}

/// Unpickle `data` (a `torch.save` `data.pkl`) into its top-level value.
fn unpickle(data: &[u8]) -> Result<Val, String> {
    let mut r = Reader { d: data, p: 0 };
    let mut stack: Vec<Val> = vec![];
    let mut memo: HashMap<u32, Val> = HashMap::new();
    // Memo gets copy values: their total is bounded, so a small pickle cannot grow huge.
    let mut budget = data.len().saturating_mul(4) + 4096;
    fn pop(stack: &mut Vec<Val>, at: usize) -> Result<Val, String> {
        stack
            .pop()
            .ok_or_else(|| format!("stack underflow at byte {at}"))
    }
    fn pop_mark(stack: &mut Vec<Val>, at: usize) -> Result<Vec<Val>, String> {
        let m = stack
            .iter()
            .rposition(|v| matches!(v, Val::Mark))
            .ok_or_else(|| format!("no mark on the stack at byte {at}"))?;
        let items = stack.split_off(m + 1);
        stack.pop();
        Ok(items)
    }
    loop {
        let at = r.p;
        let op = r.u8()?;
        match op {
            0x80 => {
                let v = r.u8()?;
                if v > 5 {
                    return Err(format!("pickle protocol {v}"));
                }
            }
            0x95 => {
                r.take(8)?; // FRAME: a length hint only
            }
            b'.' => return pop(&mut stack, at),
            b'(' => stack.push(Val::Mark),
            b'}' => stack.push(Val::Dict(vec![])),
            b']' => stack.push(Val::List(vec![])),
            b')' => stack.push(Val::Tuple(vec![])),
            b'N' => stack.push(Val::None),
            0x88 => stack.push(Val::Bool),
            0x89 => stack.push(Val::Bool),
            b'J' => stack.push(Val::Int(i32::from_le_bytes(r.take(4)?.try_into().unwrap()) as i64)),
            b'K' => stack.push(Val::Int(r.u8()? as i64)),
            b'M' => stack.push(Val::Int(r.u16()? as i64)),
            0x8a => {
                let n = r.u8()? as usize;
                let b = r.take(n)?;
                if n > 8 {
                    return Err(format!("an integer of {n} bytes at byte {at}"));
                }
                let mut buf = if b.last().is_some_and(|&x| x & 0x80 != 0) { [0xffu8; 8] } else { [0u8; 8] };
                buf[..n].copy_from_slice(b);
                stack.push(Val::Int(i64::from_le_bytes(buf)));
            }
            b'G' => { r.take(8)?; stack.push(Val::Float) },
            b'X' => {
                let n = r.u32()? as usize;
                stack.push(Val::Str(r.utf8(n)?));
            }
            0x8c => {
                let n = r.u8()? as usize;
                stack.push(Val::Str(r.utf8(n)?));
            }
            b'c' => {
                let module = r.line()?;
                let name = r.line()?;
                let full = format!("{module}.{name}");
                let ok = ALLOWED_GLOBALS.contains(&full.as_str())
                    || (module == "torch" && storage_dtype(&name).is_some());
                if !ok {
                    return Err(format!(
                        "refers to {full}, which is not part of a state dict of tensors (only torch's tensor and Parameter rebuilders are accepted; nothing is executed)"
                    ));
                }
                stack.push(Val::Global(full));
            }
            b'q' => {
                let k = r.u8()? as u32;
                memo.insert(k, stack.last().cloned().ok_or_else(|| format!("memo put of an empty stack at byte {at}"))?);
            }
            b'r' => {
                let k = r.u32()?;
                memo.insert(k, stack.last().cloned().ok_or_else(|| format!("memo put of an empty stack at byte {at}"))?);
            }
            0x94 => {
                let k = memo.len() as u32;
                memo.insert(k, stack.last().cloned().ok_or_else(|| format!("memo put of an empty stack at byte {at}"))?);
            }
            b'h' | b'j' => {
                let k = if op == b'h' { r.u8()? as u32 } else { r.u32()? };
                let v = memo.get(&k).ok_or_else(|| format!("memo get of unset key {k} at byte {at}"))?;
                budget = budget
                    .checked_sub(v.weight())
                    .ok_or_else(|| format!("memo gets copy too many values (at byte {at})"))?;
                stack.push(v.clone());
            }
            0x85 => {
                let a = pop(&mut stack, at)?;
                nest([&a], at)?;
                stack.push(Val::Tuple(vec![a]));
            }
            0x86 => {
                let b = pop(&mut stack, at)?;
                let a = pop(&mut stack, at)?;
                nest([&a, &b], at)?;
                stack.push(Val::Tuple(vec![a, b]));
            }
            0x87 => {
                let c = pop(&mut stack, at)?;
                let b = pop(&mut stack, at)?;
                let a = pop(&mut stack, at)?;
                nest([&a, &b, &c], at)?;
                stack.push(Val::Tuple(vec![a, b, c]));
            }
            b't' => {
                let items = pop_mark(&mut stack, at)?;
                nest(&items, at)?;
                stack.push(Val::Tuple(items));
            }
            b'l' => {
                let items = pop_mark(&mut stack, at)?;
                nest(&items, at)?;
                stack.push(Val::List(items));
            }
            b'a' => {
                let v = pop(&mut stack, at)?;
                nest([&v], at)?;
                match stack.last_mut() {
                    Some(Val::List(l)) => l.push(v),
                    o => return Err(format!("append to {} at byte {at}", o.map_or("nothing", |v| v.kind()))),
                }
            }
            b'e' => {
                let items = pop_mark(&mut stack, at)?;
                nest(&items, at)?;
                match stack.last_mut() {
                    Some(Val::List(l)) => l.extend(items),
                    o => return Err(format!("appends to {} at byte {at}", o.map_or("nothing", |v| v.kind()))),
                }
            }
            b's' => {
                let v = pop(&mut stack, at)?;
                let k = pop(&mut stack, at)?;
                nest([&k, &v], at)?;
                match stack.last_mut() {
                    Some(Val::Dict(d)) => d.push((k, v)),
                    o => return Err(format!("setitem on {} at byte {at}", o.map_or("nothing", |v| v.kind()))),
                }
            }
            b'u' => {
                let items = pop_mark(&mut stack, at)?;
                nest(&items, at)?;
                if items.len() % 2 != 0 {
                    return Err(format!("setitems with an odd number of values at byte {at}"));
                }
                match stack.last_mut() {
                    Some(Val::Dict(d)) => {
                        let mut it = items.into_iter();
                        while let (Some(k), Some(v)) = (it.next(), it.next()) {
                            d.push((k, v));
                        }
                    }
                    o => return Err(format!("setitems on {} at byte {at}", o.map_or("nothing", |v| v.kind()))),
                }
            }
            b'Q' => {
                let pid = pop(&mut stack, at)?;
                let Val::Tuple(t) = &pid else {
                    return Err(format!("persistent id is {}, not a tuple, at byte {at}", pid.kind()));
                };
                match t.as_slice() {
                    [Val::Str(tag), Val::Global(ty), Val::Str(key), Val::Str(_loc), Val::Int(numel)]
                        if tag == "storage" =>
                    {
                        let dtype = ty
                            .strip_prefix("torch.")
                            .and_then(storage_dtype)
                            .ok_or_else(|| format!("storage of type {ty}"))?;
                        stack.push(Val::Storage {
                            dtype,
                            key: key.clone(),
                            numel: *numel,
                        });
                    }
                    _ => return Err(format!("persistent id {pid:?} is not a torch storage reference")),
                }
            }
            b'R' => {
                let args = pop(&mut stack, at)?;
                let f = pop(&mut stack, at)?;
                let (Val::Global(f), Val::Tuple(args)) = (&f, args) else {
                    return Err(format!("reduce of {} at byte {at}", f.kind()));
                };
                stack.push(reduce(f, args).map_err(|e| format!("{e} (at byte {at})"))?);
            }
            b'b' => {
                // BUILD: a Parameter's or tensor's extra state, which RLX does not need.
                let _state = pop(&mut stack, at)?;
                if !matches!(stack.last(), Some(Val::Tensor(_))) {
                    return Err(format!("build of {} at byte {at}", stack.last().map_or("nothing", Val::kind)));
                }
            }
            o => {
                return Err(format!(
                    "opcode 0x{o:02x} at byte {at}, which torch.save does not write for a state dict of tensors"
                ))
            }
        }
    }
}

/// Read a `torch.save` zip (`bytes`, the content of `entry`) holding a dict of tensors.
/// Errors name `entry` and what in it is wrong; storages are read in full (their sizes are
/// bounded by the outer entry's), views are checked by the caller.
pub fn read_state_dict(bytes: &[u8], entry: &str) -> Result<StateDict, String> {
    if bytes.is_empty() {
        return Ok(StateDict::default());
    }
    let mut z = zip::ZipArchive::new(Cursor::new(bytes))
        .map_err(|e| format!("{entry}: not a torch.save zip ({e})"))?;
    let pkl = z
        .file_names()
        .find(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        .map(str::to_string)
        .ok_or_else(|| format!("{entry}: no <name>/data.pkl (not written by torch.save, or by a torch older than 1.6)"))?;
    let prefix = pkl.trim_end_matches("data.pkl").to_string();
    let cap = (bytes.len() as u64).saturating_mul(64);
    let read = |z: &mut zip::ZipArchive<Cursor<&[u8]>>, name: &str| -> Result<Vec<u8>, String> {
        let mut f = z
            .by_name(name)
            .map_err(|e| format!("{entry}: entry \"{name}\" is missing or unreadable ({e})"))?;
        let declared = f.size();
        if declared > cap {
            return Err(format!(
                "{entry}: entry \"{name}\" declares {declared} bytes, more than it can hold"
            ));
        }
        let mut b = Vec::with_capacity(declared as usize);
        (&mut f)
            .take(cap + 1)
            .read_to_end(&mut b)
            .map_err(|e| format!("{entry}: entry \"{name}\" is corrupted ({e})"))?;
        if b.len() as u64 != declared {
            return Err(format!(
                "{entry}: entry \"{name}\" holds {} bytes but declares {declared}",
                b.len()
            ));
        }
        Ok(b)
    };
    if z.file_names().any(|n| n == format!("{prefix}byteorder")) {
        let bo = read(&mut z, &format!("{prefix}byteorder"))?;
        if bo.trim_ascii() != b"little" {
            return Err(format!(
                "{entry}: byteorder \"{}\": only little-endian is read",
                String::from_utf8_lossy(&bo)
            ));
        }
    }
    let data = read(&mut z, &pkl)?;
    let top = unpickle(&data).map_err(|e| format!("{entry}: {pkl}: {e}"))?;
    let Val::Dict(items) = top else {
        return Err(format!(
            "{entry}: {pkl} holds {}, not a dict of tensors",
            top.kind()
        ));
    };
    let mut sd = StateDict::default();
    for (k, v) in items {
        let Val::Str(name) = k else {
            return Err(format!("{entry}: a key that is {}, not a name", k.kind()));
        };
        let Val::Tensor(t) = v else {
            return Err(format!(
                "{entry}: \"{name}\" is {}, not a tensor: RLX reads plain tensors only",
                v.kind()
            ));
        };
        if !sd.storages.contains_key(&t.key) {
            if t.key.contains('/') || t.key.contains("..") {
                return Err(format!(
                    "{entry}: \"{name}\": storage key \"{}\" leaves the data folder",
                    t.key
                ));
            }
            let b = read(&mut z, &format!("{prefix}data/{}", t.key))?;
            sd.storages.insert(t.key.clone(), b);
        }
        sd.tensors.push((name, t));
    }
    Ok(sd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_other_globals() {
        let e = unpickle(b"\x80\x02cos\nsystem\nq\x00.").unwrap_err();
        assert!(
            e.contains("os.system") && e.contains("not part of a state dict"),
            "{e}"
        );
    }

    #[test]
    fn refuses_unknown_opcodes_and_truncation() {
        let e = unpickle(b"\x80\x02}q\x00(X\x01\x00\x00\x00ai").unwrap_err();
        assert!(e.contains("opcode 0x69"), "{e}");
        let e = unpickle(b"\x80\x02}q\x00(X\xff\xff\xff\x7fab").unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        let e = unpickle(b"\x80\x02").unwrap_err();
        assert!(e.contains("truncated"), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused() {
        // (((...(0,)...),),) a million deep: refused, not a stack overflow.
        let mut p = b"\x80\x02K\x00".to_vec();
        p.extend(std::iter::repeat_n(0x85u8, 1_000_000));
        p.push(b'.');
        let e = unpickle(&p).unwrap_err();
        assert!(e.contains("nested more than 32 deep"), "{e}");
    }

    #[test]
    fn memo_bombs_are_refused() {
        // A list that doubles through memo gets, 40 times.
        let mut p = b"\x80\x02]q\x00".to_vec();
        for _ in 0..40 {
            p.extend_from_slice(b"h\x00h\x00\x86q\x00");
        }
        p.push(b'.');
        let e = unpickle(&p).unwrap_err();
        assert!(e.contains("too many"), "{e}");
    }
}
