//! The bounds-checked cursor the GGUF reader parses with: every read names what it reads and
//! fails, rather than panics, past the end; counts and lengths are checked against the bytes
//! left before anything is sized by them.

use super::MetaValue;

/// A bounds-checked cursor over the file bytes. Errors are plain strings; the caller adds
/// the file name.
pub(super) struct Cursor<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                format!(
                    "file truncated or corrupt: {what} needs {n} bytes at offset {} but the file has {}",
                    self.pos,
                    self.buf.len()
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(super) fn array<const N: usize>(
        &mut self,
        what: &str,
    ) -> std::result::Result<[u8; N], String> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> std::result::Result<u8, String> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> std::result::Result<u16, String> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(super) fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(super) fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(super) fn string(&mut self, what: &str) -> std::result::Result<String, String> {
        let len = self.u64(what)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= self.remaining())
            .ok_or_else(|| {
                format!(
                    "file truncated or corrupt: {what} claims {len} bytes at offset {} but only {} remain",
                    self.pos,
                    self.remaining()
                )
            })?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not valid UTF-8"))
    }

    pub(super) fn value(
        &mut self,
        ty: u32,
        what: &str,
        depth: u32,
    ) -> std::result::Result<MetaValue, String> {
        Ok(match ty {
            0 => MetaValue::U8(self.u8(what)?),
            1 => MetaValue::I8(self.u8(what)? as i8),
            2 => MetaValue::U16(self.u16(what)?),
            3 => MetaValue::I16(self.u16(what)? as i16),
            4 => MetaValue::U32(self.u32(what)?),
            5 => MetaValue::I32(self.u32(what)? as i32),
            6 => MetaValue::F32(f32::from_bits(self.u32(what)?)),
            7 => match self.u8(what)? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(format!("{what}: invalid bool byte {b}")),
            },
            8 => MetaValue::String(self.string(what)?),
            9 => {
                if depth > 4 {
                    return Err(format!("{what}: arrays nested too deeply"));
                }
                let item_ty = self.u32(what)?;
                let len = self.u64(what)?;
                // A length the remaining bytes cannot hold is corrupt, and must not size the
                // allocation below.
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| {
                        l.checked_mul(min_value_bytes(item_ty))
                            .is_some_and(|b| b <= self.remaining())
                    })
                    .ok_or_else(|| {
                        format!(
                            "file truncated or corrupt: {what} claims {len} array items in the {} bytes left",
                            self.remaining()
                        )
                    })?;
                let mut items = Vec::with_capacity(len);
                for _ in 0..len {
                    items.push(self.value(item_ty, what, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(self.u64(what)?),
            11 => MetaValue::I64(self.u64(what)? as i64),
            12 => MetaValue::F64(f64::from_bits(self.u64(what)?)),
            other => return Err(format!("{what}: unknown metadata value type {other}")),
        })
    }
}

/// The fewest bytes a metadata value of type `ty` takes (a string or an array is its length
/// field at least; an unknown type fails when read).
fn min_value_bytes(ty: u32) -> usize {
    match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        9 => 12,
        _ => 8,
    }
}

/// The fewest bytes of a metadata entry (key length, value type, a one-byte value) and of a
/// tensor info (name length, dimension count, one dimension, type, offset).
pub(super) const MIN_ENTRY_BYTES: u64 = 8 + 4 + 1;
pub(super) const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;
