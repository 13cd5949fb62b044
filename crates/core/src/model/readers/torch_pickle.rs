//! A safe reader for PyTorch's `torch.save` files (`pytorch_model.bin`): a zip archive holding
//! `<folder>/data.pkl` (a pickle of the state dict), one raw little-endian record per storage
//! `<folder>/data/<key>`, and optionally `<folder>/byteorder`.
//!
//! Python's unpickler runs whatever callables a pickle names, so a `.bin` from the internet is
//! a program. This reader never executes anything: it interprets only the opcodes `torch.save`
//! emits (protocol 2, plus the protocol 4 framing ones), and a global may only name a value
//! from an allow-list that rebuilds tensors: `collections.OrderedDict`,
//! `torch._utils._rebuild_tensor_v2` / `_rebuild_tensor` / `_rebuild_parameter`, the storage
//! classes (`torch.FloatStorage`, ..., `torch.UntypedStorage`) and dtypes (`torch.float32`,
//! ...). These are interpreted here, never called; any other global is refused by name.
//! Every length, index and offset read from the file is checked against what is there, and
//! containers live in an arena (no recursive values), so a hostile file is an error naming
//! what is wrong, never a panic, a stack overflow or an allocation beyond the file's size.
//!
//! The zip is read by the minimal checked reader below rather than a crate: torch writes
//! stored (uncompressed) entries only, so the data are slices of the memory map, copied once
//! into their tensors; the `zip` already in Cargo.lock (0.6, a build dependency of torch-sys)
//! predates the fuzzing fixes of later versions, which bring more dependencies. CRCs are not
//! checked (torch's own reader does not either).

use crate::model::readers::bytes::Cursor;
use crate::model::ModelError;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;
use tch::{Kind as DType, Tensor};

/// Nested dicts are flattened (`outer.inner`) down to this depth, into names of at most
/// `MAX_NAME` bytes: names are built per tensor, so this bounds their total by the file size.
const MAX_DEPTH: usize = 8;
const MAX_NAME: usize = 1024;

/// Every tensor of the state dict in a `torch.save` archive, by name: CPU tensors of the
/// stored dtype, each a view (size, stride, offset as saved) of its storage, so tensors that
/// shared a storage (tied weights, views) share memory. Non-tensor entries are skipped;
/// nested dicts are flattened with dotted names.
pub fn read(path: &Path) -> Result<HashMap<String, Tensor>, ModelError> {
    let map = crate::model::readers::safetensors::map(path)?;
    read_bytes(&map, &path.display().to_string())
}

/// `read` over a file's bytes; `file` names it in errors.
pub fn read_bytes(map: &[u8], file: &str) -> Result<HashMap<String, Tensor>, ModelError> {
    let file = file.to_string();
    let entries = zip_entries(map, &file)?;
    let corrupt = |why: String| ModelError::Corrupt { file: file.clone(), why };
    let pickles: Vec<&String> =
        entries.keys().filter(|n| n.strip_suffix("/data.pkl").is_some_and(|d| !d.contains('/'))).collect();
    let [pkl] = pickles[..] else {
        return Err(corrupt(format!(
            "expected one <folder>/data.pkl in the zip, found {} (is this a torch.save file?)",
            pickles.len()
        )));
    };
    let prefix = pkl.strip_suffix("data.pkl").unwrap_or_default();
    if let Some(order) = entries.get(&format!("{prefix}byteorder")) {
        if *order != b"little" {
            return Err(corrupt(format!(
                "byte order '{}' is not supported (only little-endian is)",
                String::from_utf8_lossy(order)
            )));
        }
    }
    let bytes = entries.get(pkl).copied().unwrap_or_default();
    let mut u = Unpickler {
        c: Cursor::new(bytes, &file),
        file: &file,
        at: 0,
        entries: &entries,
        prefix,
        stack: vec![],
        marks: vec![],
        memo: HashMap::new(),
        objs: vec![],
        storages: HashMap::new(),
    };
    let top = u.run()?;
    let mut out = HashMap::new();
    match &top {
        Value::Obj(i) if matches!(u.objs.get(*i), Some(Obj::Dict(_))) => {
            u.collect(&top, "", 0, &mut HashSet::new(), &mut out)?
        }
        other => return Err(corrupt(format!("data.pkl holds {}, not a dict of tensors", other.kind()))),
    }
    Ok(out)
}

/// The entries of a zip archive, name -> data; only stored (uncompressed) entries.
fn zip_entries<'a>(b: &'a [u8], file: &'a str) -> Result<HashMap<String, &'a [u8]>, ModelError> {
    let mut c = Cursor::new(b, file);
    let not_zip = || {
        c_err(file, "not a zip archive (no end-of-central-directory record); torch.save files before torch 1.6 are not supported".into())
    };
    // The end record (22 bytes, then a comment of up to 64 KiB) is the last "PK\5\6".
    let lo = b.len().saturating_sub(22 + 0xFFFF);
    let eocd = (lo..=b.len().saturating_sub(22))
        .rev()
        .find(|&i| b.get(i..i + 4) == Some(b"PK\x05\x06"))
        .ok_or_else(not_zip)?;
    c.pos = eocd + 10;
    let (mut count, mut cd_size, mut cd_off) = (
        u64::from(u16s(&mut c, "zip entry count")?),
        u64::from(c.u32("zip directory size")?),
        u64::from(c.u32("zip directory offset")?),
    );
    if count == 0xFFFF || cd_size == 0xFFFF_FFFF || cd_off == 0xFFFF_FFFF {
        // ZIP64: a locator just before the end record points at the ZIP64 end record.
        c.pos = eocd.checked_sub(20).ok_or_else(|| c_err(file, "zip64 end record locator is missing".into()))?;
        magic(&mut c, b"PK\x06\x07", "zip64 end record locator")?;
        c.take(4, "zip64 locator")?;
        c.pos = usize::try_from(c.u64("zip64 end record offset")?)
            .ok()
            .filter(|&p| p <= b.len())
            .ok_or_else(|| c_err(file, "zip64 end record offset passes the end of the file".into()))?;
        magic(&mut c, b"PK\x06\x06", "zip64 end record")?;
        c.take(28, "zip64 end record")?;
        (count, cd_size, cd_off) =
            (c.u64("zip64 entry count")?, c.u64("zip64 directory size")?, c.u64("zip64 directory offset")?);
    }
    let cd =
        cd_off.checked_add(cd_size).and_then(|end| b.get(usize::try_from(cd_off).ok()?..usize::try_from(end).ok()?));
    let cd = cd.ok_or_else(|| {
        c_err(
            file,
            format!("zip directory ({cd_size} bytes at {cd_off}) passes the end of the file ({} bytes)", b.len()),
        )
    })?;
    let mut d = Cursor::new(cd, file);
    let mut out = HashMap::new();
    for _ in 0..count {
        magic(&mut d, b"PK\x01\x02", "zip directory entry")?;
        d.take(4, "zip directory entry")?;
        let (flags, method) = (u16s(&mut d, "zip flags")?, u16s(&mut d, "zip method")?);
        d.take(8, "zip directory entry")?;
        let (mut csize, mut size) = (u64::from(d.u32("zip entry size")?), u64::from(d.u32("zip entry size")?));
        let (name_len, extra_len, comment_len) =
            (u16s(&mut d, "zip name length")?, u16s(&mut d, "zip extra length")?, u16s(&mut d, "zip comment length")?);
        d.take(8, "zip directory entry")?;
        let mut offset = u64::from(d.u32("zip entry offset")?);
        let name = std::str::from_utf8(d.take(name_len.into(), "zip entry name")?)
            .map_err(|_| c_err(file, "a zip entry name is not UTF-8".into()))?;
        let mut x = Cursor::new(d.take(extra_len.into(), "zip extra field")?, file);
        while x.pos < x.b.len() {
            let (id, len) = (u16s(&mut x, "zip extra field")?, u16s(&mut x, "zip extra field")?);
            let mut f = Cursor::new(x.take(len.into(), "zip extra field")?, file);
            if id == 1 {
                // The ZIP64 field holds, in this order, those of the three that overflowed.
                for v in [&mut size, &mut csize, &mut offset] {
                    if *v == 0xFFFF_FFFF {
                        *v = f.u64(&format!("zip64 field of '{}'", shown(name)))?;
                    }
                }
            }
        }
        d.take(comment_len.into(), "zip entry comment")?;
        if flags & 1 != 0 || method != 0 || csize != size {
            return Err(c_err(
                file,
                format!("zip entry '{}' is compressed or encrypted (torch writes stored entries)", shown(name)),
            ));
        }
        let mut l = Cursor::new(b, file);
        l.pos = usize::try_from(offset)
            .ok()
            .filter(|&p| p <= b.len())
            .ok_or_else(|| c_err(file, format!("zip entry '{}' starts past the end of the file", shown(name))))?;
        magic(&mut l, b"PK\x03\x04", "zip local header")?;
        l.take(22, "zip local header")?;
        let skip = u64::from(u16s(&mut l, "zip local header")?) + u64::from(u16s(&mut l, "zip local header")?);
        l.take(skip, "zip local header")?;
        let data = l.take(size, &format!("zip entry '{}'", shown(name)))?;
        if out.insert(name.to_string(), data).is_some() {
            return Err(c_err(file, format!("zip entry '{}' appears twice", shown(name))));
        }
    }
    Ok(out)
}

fn c_err(file: &str, why: String) -> ModelError {
    ModelError::Corrupt { file: file.into(), why }
}

/// A name from the file for a one-line message: escaped, at most 200 characters.
fn shown(s: &str) -> String {
    s.chars().take(200).flat_map(char::escape_debug).collect()
}

fn magic(c: &mut Cursor, want: &[u8; 4], what: &str) -> Result<(), ModelError> {
    let at = c.pos;
    if c.take(4, what)? != want {
        return Err(c.corrupt(format!("{what} expected at byte {at} is not there")));
    }
    Ok(())
}

fn arr<const N: usize>(c: &mut Cursor, what: &str) -> Result<[u8; N], ModelError> {
    let b = c.take(N as u64, what)?;
    b.try_into().map_err(|_| c.corrupt(format!("{what}: short read")))
}

fn u16s(c: &mut Cursor, what: &str) -> Result<u16, ModelError> {
    arr(c, what).map(u16::from_le_bytes)
}

/// A global the allow-list admits.
#[derive(Clone, Copy, Debug)]
enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildTensor,
    RebuildParameter,
    /// A storage class or a dtype: the dtype of a storage record.
    Dtype(DType),
}

fn allowed(module: &str, name: &str) -> Option<Global> {
    let dtype = |n: &str| match n {
        "FloatStorage" | "float32" | "float" => Some(DType::Float),
        "HalfStorage" | "float16" | "half" => Some(DType::Half),
        "BFloat16Storage" | "bfloat16" => Some(DType::BFloat16),
        "DoubleStorage" | "float64" | "double" => Some(DType::Double),
        "LongStorage" | "int64" | "long" => Some(DType::Int64),
        "IntStorage" | "int32" | "int" => Some(DType::Int),
        "ShortStorage" | "int16" | "short" => Some(DType::Int16),
        "CharStorage" | "int8" => Some(DType::Int8),
        "ByteStorage" | "uint8" => Some(DType::Uint8),
        "BoolStorage" | "bool" => Some(DType::Bool),
        _ => None,
    };
    match (module, name) {
        ("collections", "OrderedDict") => Some(Global::OrderedDict),
        ("torch._utils", "_rebuild_tensor_v2") => Some(Global::RebuildTensorV2),
        ("torch._utils", "_rebuild_tensor") => Some(Global::RebuildTensor),
        ("torch._utils", "_rebuild_parameter") => Some(Global::RebuildParameter),
        ("torch" | "torch.storage", "UntypedStorage") => Some(Global::Dtype(DType::Uint8)),
        ("torch", n) => dtype(n).map(Global::Dtype),
        _ => None,
    }
}

/// A storage record, read once and shared by every tensor that views it.
struct Storage {
    dtype: DType,
    numel: i64,
    data: Tensor,
}

#[derive(Clone)]
enum Value {
    None,
    /// Bools (`requires_grad`) and floats are never needed, only skipped over.
    Bool,
    Int(i64),
    Float,
    Str(Rc<str>),
    /// A tuple, list or dict: an index into the arena.
    Obj(usize),
    Global(Global),
    Storage(Rc<Storage>),
    Tensor(Rc<Tensor>),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool => "a bool",
            Value::Int(_) => "an int",
            Value::Float => "a float",
            Value::Str(_) => "a string",
            Value::Obj(_) => "a container",
            Value::Global(_) => "a global",
            Value::Storage(_) => "a storage",
            Value::Tensor(_) => "a tensor",
        }
    }
}

enum Obj {
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
}

struct Unpickler<'a> {
    c: Cursor<'a>,
    file: &'a str,
    /// Where the current opcode starts, for errors.
    at: usize,
    entries: &'a HashMap<String, &'a [u8]>,
    prefix: &'a str,
    stack: Vec<Value>,
    /// The stacks below each MARK (as Python's unpickler keeps them).
    marks: Vec<Vec<Value>>,
    memo: HashMap<u32, Value>,
    objs: Vec<Obj>,
    storages: HashMap<Rc<str>, Rc<Storage>>,
}

impl<'a> Unpickler<'a> {
    fn bad(&self, why: impl std::fmt::Display) -> ModelError {
        c_err(self.file, format!("data.pkl byte {}: {why}", self.at))
    }

    /// The next `n` bytes of the pickle.
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], ModelError> {
        let left = self.c.b.len().saturating_sub(self.c.pos);
        if n > left as u64 {
            return Err(self.bad(format!("truncated: {what} needs {n} bytes, {left} are left")));
        }
        self.c.take(n, what)
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ModelError> {
        let b = self.take(N as u64, what)?;
        b.try_into().map_err(|_| self.bad(what))
    }

    fn pop(&mut self) -> Result<Value, ModelError> {
        self.stack.pop().ok_or_else(|| self.bad("pickle stack underflow"))
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, ModelError> {
        let below = self.marks.pop().ok_or_else(|| self.bad("no MARK to pop to"))?;
        Ok(std::mem::replace(&mut self.stack, below))
    }

    fn new_obj(&mut self, o: Obj) -> Value {
        self.objs.push(o);
        Value::Obj(self.objs.len() - 1)
    }

    fn string(&mut self, n: u64, utf8: bool) -> Result<Value, ModelError> {
        let b = self.take(n, "a string")?;
        let s: Rc<str> = if utf8 {
            std::str::from_utf8(b).map_err(|_| self.bad("string is not UTF-8"))?.into()
        } else {
            b.iter().map(|&x| char::from(x)).collect::<String>().into()
        };
        Ok(Value::Str(s))
    }

    fn line(&mut self) -> Result<String, ModelError> {
        let rest = self.c.b.get(self.c.pos..).unwrap_or_default();
        let n = rest.iter().position(|&x| x == b'\n').ok_or_else(|| self.bad("GLOBAL name without a newline"))?;
        let b = self.take(n as u64 + 1, "pickle GLOBAL")?;
        Ok(String::from_utf8_lossy(b.get(..n).unwrap_or_default()).into_owned())
    }

    fn global(&self, module: &str, name: &str) -> Result<Value, ModelError> {
        allowed(module, name).map(Value::Global).ok_or_else(|| {
            ModelError::Io(
                self.file.into(),
                format!(
                    "refused pickle global '{}.{}' (only torch's tensor-rebuilding globals are allowed)",
                    shown(module),
                    shown(name)
                ),
            )
        })
    }

    fn int(&self, v: &Value, what: &str) -> Result<i64, ModelError> {
        match v {
            Value::Int(i) => Ok(*i),
            other => Err(self.bad(format!("{what} is {}, not an int", other.kind()))),
        }
    }

    /// The items of a tuple (or list) value.
    fn items(&self, v: &Value, what: &str) -> Result<&[Value], ModelError> {
        match v {
            Value::Obj(i) => match self.objs.get(*i) {
                Some(Obj::Tuple(t) | Obj::List(t)) => Ok(t),
                _ => Err(self.bad(format!("{what} is not a tuple"))),
            },
            other => Err(self.bad(format!("{what} is {}, not a tuple", other.kind()))),
        }
    }

    fn ints(&self, v: &Value, what: &str) -> Result<Vec<i64>, ModelError> {
        self.items(v, what)?.iter().map(|x| self.int(x, what)).collect()
    }

    /// `('storage', storage_type, key, location, numel)` -> the record `data/<key>`.
    fn persistent_load(&mut self, pid: &Value) -> Result<Rc<Storage>, ModelError> {
        let [Value::Str(tag), Value::Global(Global::Dtype(dtype)), Value::Str(key), _, Value::Int(numel)] =
            self.items(pid, "persistent id")?
        else {
            return Err(self.bad("persistent id is not ('storage', type, key, location, numel)"));
        };
        let (tag, dtype, key, numel) = (tag.clone(), *dtype, key.clone(), *numel);
        if &*tag != "storage" {
            return Err(self.bad(format!("persistent id of kind '{}' (only 'storage' is known)", shown(&tag))));
        }
        if let Some(s) = self.storages.get(&key) {
            if s.dtype != dtype || s.numel != numel {
                return Err(self.bad(format!("storage '{}' is read as two different types", shown(&key))));
            }
            return Ok(s.clone());
        }
        let name = format!("{}data/{key}", self.prefix);
        let bytes = *self
            .entries
            .get(&name)
            .ok_or_else(|| self.bad(format!("storage record '{}' is missing from the zip", shown(&name))))?;
        let need = u64::try_from(numel).ok().and_then(|n| n.checked_mul(dtype.elt_size_in_bytes() as u64));
        if need != Some(bytes.len() as u64) {
            return Err(self.bad(format!(
                "storage '{}' has {} bytes, not the {numel} elements of {dtype:?} it declares",
                shown(&name),
                bytes.len()
            )));
        }
        // A bool is one byte that must be 0 or 1.
        let fixed: Vec<u8>;
        let bytes = if dtype == DType::Bool {
            fixed = bytes.iter().map(|&x| u8::from(x != 0)).collect();
            &fixed[..]
        } else {
            bytes
        };
        let s = Rc::new(Storage { dtype, numel, data: Tensor::f_from_data_size(bytes, &[numel], dtype)? });
        self.storages.insert(key, s.clone());
        Ok(s)
    }

    /// `_rebuild_tensor[_v2](storage, storage_offset, size, stride, ...)`: a checked view.
    fn rebuild(&self, args: &[Value]) -> Result<Value, ModelError> {
        let [Value::Storage(s), offset, size, stride, ..] = args else {
            return Err(self.bad("tensor rebuild without (storage, offset, size, stride)"));
        };
        let (offset, size, stride) =
            (self.int(offset, "storage offset")?, self.ints(size, "tensor size")?, self.ints(stride, "tensor stride")?);
        if size.len() != stride.len() || size.len() > 64 || offset < 0 || size.iter().chain(&stride).any(|&x| x < 0) {
            return Err(self.bad(format!("bad tensor geometry: size {size:?}, stride {stride:?}, offset {offset}")));
        }
        // The elements from the offset to the last one reached, if any: all within the storage.
        let extent = if size.contains(&0) {
            Some(offset)
        } else {
            let last =
                size.iter().zip(&stride).try_fold(offset, |acc, (&n, &st)| acc.checked_add((n - 1).checked_mul(st)?));
            last.and_then(|l| l.checked_add(1))
        };
        if extent.is_none_or(|e| e > s.numel) {
            return Err(self.bad(format!("tensor of size {size:?}, stride {stride:?}, offset {offset} passes the end of its storage of {} elements", s.numel)));
        }
        Ok(Value::Tensor(Rc::new(s.data.f_as_strided(&size[..], &stride[..], offset)?)))
    }

    /// REDUCE: the allowed callables, interpreted.
    fn call(&mut self, f: &Value, args: &Value) -> Result<Value, ModelError> {
        let args = self.items(args, "call arguments")?;
        match f {
            Value::Global(Global::OrderedDict) if args.is_empty() => Ok(self.new_obj(Obj::Dict(vec![]))),
            Value::Global(Global::RebuildTensorV2 | Global::RebuildTensor) => self.rebuild(args),
            Value::Global(Global::RebuildParameter) => match args.first() {
                Some(t @ Value::Tensor(_)) => Ok(t.clone()),
                _ => Err(self.bad("_rebuild_parameter without a tensor")),
            },
            other => Err(self.bad(format!("cannot call {} ({} arguments)", other.kind(), args.len()))),
        }
    }

    fn top_obj(&mut self) -> Result<&mut Obj, ModelError> {
        let i = match self.stack.last() {
            Some(Value::Obj(i)) => *i,
            _ => return Err(self.bad("SETITEM/APPEND target is not a list or dict")),
        };
        self.objs.get_mut(i).ok_or_else(|| c_err(self.file, "bad object index".into()))
    }

    fn set_items(&mut self, items: Vec<Value>) -> Result<(), ModelError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.bad("SETITEMS with an odd number of items"));
        }
        let Obj::Dict(d) = self.top_obj()? else { return Err(self.bad("SETITEM on a non-dict")) };
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            d.push((k, v));
        }
        Ok(())
    }

    fn append(&mut self, items: Vec<Value>) -> Result<(), ModelError> {
        let Obj::List(l) = self.top_obj()? else { return Err(self.bad("APPEND on a non-list")) };
        l.extend(items);
        Ok(())
    }

    fn run(&mut self) -> Result<Value, ModelError> {
        loop {
            self.at = self.c.pos;
            let [op] = self.bytes("an opcode (no STOP before the end)")?;
            match op {
                0x80 => {
                    let [v] = self.bytes("PROTO")?;
                    if v > 5 {
                        return Err(self.bad(format!("pickle protocol {v}")));
                    }
                }
                0x95 => {
                    self.take(8, "FRAME")?;
                }
                b'c' => {
                    let (module, name) = (self.line()?, self.line()?);
                    let g = self.global(&module, &name)?;
                    self.stack.push(g);
                }
                0x93 => match (self.pop()?, self.pop()?) {
                    (Value::Str(name), Value::Str(module)) => {
                        let g = self.global(&module, &name)?;
                        self.stack.push(g);
                    }
                    _ => return Err(self.bad("STACK_GLOBAL without two strings")),
                },
                b'Q' => {
                    let pid = self.pop()?;
                    let s = self.persistent_load(&pid)?;
                    self.stack.push(Value::Storage(s));
                }
                b'}' | b']' | b')' => {
                    let o = match op {
                        b'}' => Obj::Dict(vec![]),
                        b']' => Obj::List(vec![]),
                        _ => Obj::Tuple(vec![]),
                    };
                    let v = self.new_obj(o);
                    self.stack.push(v);
                }
                b'(' => {
                    let below = std::mem::take(&mut self.stack);
                    self.marks.push(below);
                }
                b't' | 0x85..=0x87 => {
                    let items = if op == b't' {
                        self.pop_mark()?
                    } else {
                        let n = usize::from(op - 0x84);
                        let at = self.stack.len().checked_sub(n).ok_or_else(|| self.bad("pickle stack underflow"))?;
                        self.stack.split_off(at)
                    };
                    let v = self.new_obj(Obj::Tuple(items));
                    self.stack.push(v);
                }
                b'X' | 0x8c | 0x8d | b'T' | b'U' => {
                    let n = match op {
                        b'X' => u64::from(u32::from_le_bytes(self.bytes("BINUNICODE length")?)),
                        0x8d => u64::from_le_bytes(self.bytes("BINUNICODE8 length")?),
                        b'T' => u64::try_from(i32::from_le_bytes(self.bytes("BINSTRING length")?))
                            .map_err(|_| self.bad("negative string length"))?,
                        _ => u64::from(self.bytes::<1>("string length")?[0]),
                    };
                    let v = self.string(n, !matches!(op, b'T' | b'U'))?;
                    self.stack.push(v);
                }
                b'J' => {
                    let v = i32::from_le_bytes(self.bytes("BININT")?);
                    self.stack.push(Value::Int(v.into()));
                }
                b'K' => {
                    let [v] = self.bytes("BININT1")?;
                    self.stack.push(Value::Int(v.into()));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.bytes("BININT2")?);
                    self.stack.push(Value::Int(v.into()));
                }
                0x8a => {
                    let [n] = self.bytes("LONG1 length")?;
                    let b = self.take(n.into(), "LONG1")?;
                    if n > 8 {
                        return Err(self.bad(format!("integer of {n} bytes does not fit 64 bits")));
                    }
                    // Little-endian two's complement, sign-extended from its last byte.
                    let fill = if b.last().is_some_and(|&x| x & 0x80 != 0) { 0xFF } else { 0 };
                    let mut le = [fill; 8];
                    le.iter_mut().zip(b).for_each(|(d, &s)| *d = s);
                    self.stack.push(Value::Int(i64::from_le_bytes(le)));
                }
                b'G' => {
                    self.take(8, "BINFLOAT")?;
                    self.stack.push(Value::Float);
                }
                0x88 | 0x89 => self.stack.push(Value::Bool),
                b'N' => self.stack.push(Value::None),
                b'q' | b'r' | 0x94 => {
                    let i = match op {
                        b'q' => u32::from(self.bytes::<1>("BINPUT")?[0]),
                        b'r' => u32::from_le_bytes(self.bytes("LONG_BINPUT")?),
                        _ => u32::try_from(self.memo.len()).map_err(|_| self.bad("memo overflow"))?,
                    };
                    let v = self.stack.last().cloned().ok_or_else(|| self.bad("memoizing an empty stack"))?;
                    self.memo.insert(i, v);
                }
                b'h' | b'j' => {
                    let i = if op == b'h' {
                        u32::from(self.bytes::<1>("BINGET")?[0])
                    } else {
                        u32::from_le_bytes(self.bytes("LONG_BINGET")?)
                    };
                    let v = self
                        .memo
                        .get(&i)
                        .cloned()
                        .ok_or_else(|| self.bad(format!("memo entry {i} was never stored")))?;
                    self.stack.push(v);
                }
                b's' => {
                    let (v, k) = (self.pop()?, self.pop()?);
                    self.set_items(vec![k, v])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.append(vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark()?;
                    self.append(items)?;
                }
                b'R' => {
                    let (args, f) = (self.pop()?, self.pop()?);
                    let v = self.call(&f, &args)?;
                    self.stack.push(v);
                }
                // BUILD on a dict is a state_dict's `_metadata` attribute: not needed, dropped.
                b'b' => {
                    self.pop()?;
                    if !matches!(self.stack.last(), Some(Value::Obj(i)) if matches!(self.objs.get(*i), Some(Obj::Dict(_))))
                    {
                        return Err(self.bad("BUILD on something other than a dict"));
                    }
                }
                b'.' => return self.pop(),
                other => return Err(self.bad(format!("pickle opcode 0x{other:02x} is not one torch.save writes"))),
            }
        }
    }

    /// The tensors of dict `v`, names prefixed by `prefix`, into `out`. A dict is visited once
    /// (`seen`): a cycle or a sub-dict shared n times would otherwise multiply the names.
    fn collect(
        &self,
        v: &Value,
        prefix: &str,
        depth: usize,
        seen: &mut HashSet<usize>,
        out: &mut HashMap<String, Tensor>,
    ) -> Result<(), ModelError> {
        let Value::Obj(i) = v else { return Ok(()) };
        let Some(Obj::Dict(items)) = self.objs.get(*i) else { return Ok(()) };
        if !seen.insert(*i) {
            return Err(c_err(
                self.file,
                format!(
                    "dict '{}' is reached twice (a cycle or a shared sub-dict)",
                    shown(prefix.trim_end_matches('.'))
                ),
            ));
        }
        if depth >= MAX_DEPTH {
            return Err(c_err(self.file, format!("dicts nested deeper than {MAX_DEPTH} levels")));
        }
        for (k, v) in items {
            if !matches!(v, Value::Tensor(_) | Value::Obj(_)) {
                continue;
            }
            let name = match k {
                Value::Str(s) => format!("{prefix}{s}"),
                Value::Int(n) => format!("{prefix}{n}"),
                _ => continue,
            };
            if name.len() > MAX_NAME {
                return Err(c_err(
                    self.file,
                    format!("tensor name '{}...' is longer than {MAX_NAME} bytes", shown(&name)),
                ));
            }
            match v {
                Value::Tensor(t) => {
                    if out.contains_key(&name) {
                        return Err(c_err(self.file, format!("tensor '{}' appears twice", shown(&name))));
                    }
                    out.insert(name, t.shallow_clone());
                }
                _ => self.collect(v, &format!("{name}."), depth + 1, seen, out)?,
            }
        }
        Ok(())
    }
}
