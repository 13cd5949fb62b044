//! A bounds-checked cursor over a checkpoint's bytes, shared by the binary readers (GGUF,
//! Marian `.bin`), and checked element counts. Every length, count and offset read from a
//! file is checked against what is left of the file before it is used, in arithmetic that
//! cannot overflow, so a hostile header is an error naming the field, never a panic or a
//! huge allocation.

use crate::model::ModelError;

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
}
