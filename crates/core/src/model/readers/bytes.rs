//! A bounds-checked cursor over a checkpoint's bytes, shared by the binary readers (GGUF,
//! Marian `.bin`), and checked element counts. Every length, count and offset read from a
//! file is checked against what is left of the file before it is used, in arithmetic that
//! cannot overflow, so a hostile header is an error naming the field, never a panic or a
//! huge allocation.

use crate::model::ModelError;
use tch::{Device, Kind as DType, Tensor};

pub struct Cursor<'a> {
    pub b: &'a [u8],
    pub pos: usize,
    pub file: &'a str,
}

impl<'a> Cursor<'a> {
    pub fn new(b: &'a [u8], file: &'a str) -> Self {
        Cursor { b, pos: 0, file }
    }

    pub fn corrupt(&self, why: String) -> ModelError {
        ModelError::Corrupt { file: self.file.into(), why }
    }

    /// The next `n` bytes (`n` as read from the file, any u64).
    pub fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], ModelError> {
        let left = (self.b.len() - self.pos) as u64;
        if n > left {
            return Err(self.corrupt(format!(
                "truncated while reading {what}: {n} bytes declared at byte {}, {left} left in the file",
                self.pos
            )));
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    /// A count of items of at least `min_bytes` each that must still fit in the file.
    pub fn count(&mut self, min_bytes: u64, what: &str) -> Result<usize, ModelError> {
        let n = self.u64(what)?;
        let left = (self.b.len() - self.pos) as u64;
        if n.checked_mul(min_bytes.max(1)).is_none_or(|need| need > left) {
            return Err(self
                .corrupt(format!("{what}: declares {n} items, more than the {left} bytes left in the file can hold")));
        }
        Ok(n as usize)
    }
}

/// The element count of `dims` (any order), or an error naming the tensor when a dimension
/// is negative or the count passes 2^63. The non-zero dimensions alone must stay under 2^63
/// too: libtorch multiplies them in order and refuses an overflow even when a later dimension
/// is 0 (a GGUF of shape [2^40, 2^40, 0] once panicked in `view`).
pub fn elements(dims: impl IntoIterator<Item = i128>, what: &str, file: &str) -> Result<usize, ModelError> {
    let (mut n, mut nonzero): (i128, i128) = (1, 1);
    for d in dims {
        if d < 0 {
            return Err(ModelError::Corrupt { file: file.into(), why: format!("{what}: negative dimension {d}") });
        }
        n = n.saturating_mul(d);
        nonzero = nonzero.saturating_mul(d.max(1));
        if n > i64::MAX as i128 || nonzero > i64::MAX as i128 {
            return Err(ModelError::Corrupt {
                file: file.into(),
                why: format!("{what}: shape declares more than 2^63 elements"),
            });
        }
    }
    Ok(n as usize)
}

/// `count * size` bytes, checked to fit in `left` bytes.
pub fn byte_len(count: usize, size: usize, left: usize, what: &str, file: &str) -> Result<usize, ModelError> {
    match count.checked_mul(size) {
        Some(n) if n <= left => Ok(n),
        _ => Err(ModelError::Corrupt {
            file: file.into(),
            why: format!("{what}: {count} elements of {size} bytes do not fit in the {left} bytes the file has for it"),
        }),
    }
}

/// A checkpoint's bytes, whose pages are given back once a tensor is copied out of them: a
/// memory map drops them from the resident set (`madvise(MADV_DONTNEED)`; the file's page
/// cache keeps them, so nothing is read twice), bytes already in memory have nothing to give.
/// So loading holds the weights read so far plus one piece of the file, not the weights plus
/// the file (docs/methods.md#loading-memory).
pub trait Pages: Send + Sync {
    fn bytes(&self) -> &[u8];
    /// Bytes `start..start + len` will not be read again (a hint; a later read still works).
    fn release(&self, _start: usize, _len: usize) {}
}

impl Pages for memmap2::Mmap {
    fn bytes(&self) -> &[u8] {
        self
    }
    fn release(&self, start: usize, len: usize) {
        if start.checked_add(len).is_some_and(|e| e <= self.len()) && len > 0 {
            // SAFETY: a read-only map of a file: dropped pages are read again from the file
            // when touched, with the same bytes (the checkpoint must not change while it loads,
            // as `safetensors::map` says), so slices into the range stay valid.
            let _ = unsafe { self.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
        }
    }
}

impl Pages for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

impl Pages for &[u8] {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Bytes of a file copied out (or produced, for quantised blocks) per piece: what loading
/// holds beyond the weights already read.
pub const PIECE: usize = 16 << 20;

/// A 1-D tensor of `count` elements of dtype `to` on the CPU, filled a piece of at most
/// `piece` elements at a time from `part(at, n)` (a tensor of `n` elements of any dtype,
/// converted as `Tensor::to_kind` converts).
pub fn in_pieces(
    count: usize,
    to: DType,
    piece: usize,
    mut part: impl FnMut(usize, usize) -> Result<Tensor, ModelError>,
) -> Result<Tensor, ModelError> {
    let out = Tensor::f_empty([count as i64], (to, Device::Cpu))?;
    let mut at = 0;
    while at < count {
        let n = piece.max(1).min(count - at);
        let src = part(at, n)?;
        let mut piece_of_out = out.f_narrow(0, at as i64, n as i64)?;
        piece_of_out.f_copy_(&src)?;
        at += n;
    }
    Ok(out)
}

fn floating(k: DType) -> bool {
    matches!(k, DType::Half | DType::Float | DType::Double | DType::BFloat16)
}

/// The tensor of `shape` whose elements of dtype `from` lie at bytes `start..` of `pages`,
/// in dtype `to` where both are floating point (else as stored), copied a piece at a time,
/// each piece's pages released once copied. The range must have been checked to lie in the
/// file.
pub fn tensor_out(
    pages: &dyn Pages,
    start: usize,
    shape: &[i64],
    count: usize,
    from: DType,
    to: Option<DType>,
) -> Result<Tensor, ModelError> {
    let to = match to {
        Some(k) if floating(from) && floating(k) => k,
        _ => from,
    };
    let elem = from.elt_size_in_bytes();
    let bytes = pages.bytes();
    let t = in_pieces(count, to, PIECE / elem, |at, n| {
        let (s, len) = (start + at * elem, n * elem);
        let t = Tensor::f_from_data_size(&bytes[s..s + len], &[n as i64], from)?;
        pages.release(s, len);
        Ok(t)
    })?;
    Ok(t.f_view(shape)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_past_the_end_or_2_63_are_errors() {
        let bytes = [0xffu8; 16];
        let mut c = Cursor::new(&bytes, "f.bin");
        assert!(c.take(u64::MAX, "a name").unwrap_err().to_string().contains("a name"));
        assert!(c.take(1 << 63, "x").is_err());
        assert_eq!(c.pos, 0, "a refused take does not move");
        assert!(c.count(1, "the count").unwrap_err().to_string().contains("the count"));
        assert!(elements([1i128 << 40, 1 << 40], "t", "f").unwrap_err().to_string().contains("2^63"));
        assert!(elements([-1i128], "t", "f").unwrap_err().to_string().contains("negative"));
        assert_eq!(elements([3i128, 4], "t", "f").unwrap(), 12);
        assert_eq!(elements([3i128, 0], "t", "f").unwrap(), 0);
        assert!(
            elements([1i128 << 40, 1 << 40, 0], "t", "f").unwrap_err().to_string().contains("2^63"),
            "a zero does not excuse the others"
        );
        assert!(byte_len(usize::MAX, 4, 100, "t", "f").is_err());
        assert_eq!(byte_len(3, 4, 12, "t", "f").unwrap(), 12);
    }

    #[test]
    fn pieces_cover_every_element_once_and_convert_as_to_kind() {
        // Pieces that do not divide the count; a conversion equal to `to_kind`'s.
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 1e3 + 1.0 / (i as f32 + 3.0)).collect();
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let pages: &[u8] = &bytes;
        let want = Tensor::from_slice(&x).view([10, 100]);
        for piece in [1, 7, 333, 1000, 5000] {
            let t = in_pieces(1000, DType::BFloat16, piece, |at, n| Ok(Tensor::from_slice(&x[at..at + n]))).unwrap();
            assert!(t.view([10, 100]).equal(&want.to_kind(DType::BFloat16)), "piece {piece}");
        }
        let t = tensor_out(&pages, 0, &[10, 100], 1000, DType::Float, Some(DType::BFloat16)).unwrap();
        assert!(t.equal(&want.to_kind(DType::BFloat16)));
        let t = tensor_out(&pages, 0, &[10, 100], 1000, DType::Float, None).unwrap();
        assert!(t.equal(&want));
        // Integers keep their dtype.
        let t = tensor_out(&pages, 0, &[1000], 1000, DType::Int, Some(DType::BFloat16)).unwrap();
        assert_eq!(t.kind(), DType::Int);
        assert!(in_pieces(0, DType::Float, 4, |_, _| unreachable!()).unwrap().numel() == 0);
    }
}
