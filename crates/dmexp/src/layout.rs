//! The fixed 24-byte prefix that starts every `.dmexp` file.
//!
//! | bytes      | content                                      |
//! |------------|----------------------------------------------|
//! | `[0..7)`   | ASCII `DMEXPRT`                              |
//! | `[7]`      | format version byte (`0x01`)                 |
//! | `[8..12)`  | header length `H`, u32 little-endian         |
//! | `[12..20)` | payload length `P`, u64 little-endian        |
//! | `[20..24)` | CRC-32 (IEEE) of the payload, u32 LE         |

/// The seven ASCII bytes every export starts with; the eighth byte is the version.
pub const MAGIC: &[u8; 7] = b"DMEXPRT";

/// The only format version this crate reads and writes.
pub const FORMAT_VERSION: u8 = 1;

/// Every version this crate can read, for the "unknown version" message.
pub const KNOWN_VERSIONS: &[u8] = &[FORMAT_VERSION];

/// Length of the fixed prefix: magic + version, header length, payload length, CRC.
pub const PREFIX_LEN: usize = 24;

/// Upper bound on the TOML header, checked before anything is allocated for it.
///
/// The header of the `small` model is about 6 KiB; 4 MiB leaves room for models with tens of
/// thousands of tensors. The bound is low because parsing TOML costs far more memory than
/// the text: about 50 bytes per header byte for a header of tiny tensors (a 57 MB one of
/// 1.2 million tensors took 3.0 GB to read), so 4 MiB bounds a hostile header to about
/// 200 MiB (`tests/header_memory.rs` measures it).
pub const MAX_HEADER_LEN: u32 = 4 * 1024 * 1024;

/// The decoded fixed prefix. Only the layout is known here; nothing is validated
/// beyond what the bytes can say on their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// The version byte at offset 7.
    pub version: u8,
    /// Length in bytes of the UTF-8 TOML header.
    pub header_len: u32,
    /// Length in bytes of the payload (all tensors, contiguous).
    pub payload_len: u64,
    /// CRC-32 (IEEE) of the payload bytes.
    pub payload_crc32: u32,
}

impl Prefix {
    /// Reads the prefix fields from the first [`PREFIX_LEN`] bytes. Returns `None` when
    /// fewer bytes are given; the magic is not checked here.
    pub fn read(bytes: &[u8]) -> Option<Prefix> {
        let prefix: &[u8; PREFIX_LEN] = bytes.get(..PREFIX_LEN)?.try_into().ok()?;
        let (_magic, rest) = prefix.split_at(7);
        let (version, rest) = rest.split_first()?;
        let (header_len, rest) = rest.split_at(4);
        let (payload_len, crc) = rest.split_at(8);
        Some(Prefix {
            version: *version,
            header_len: u32::from_le_bytes(header_len.try_into().ok()?),
            payload_len: u64::from_le_bytes(payload_len.try_into().ok()?),
            payload_crc32: u32::from_le_bytes(crc.try_into().ok()?),
        })
    }

    /// The 24 bytes that encode this prefix, magic included.
    pub fn to_bytes(&self) -> [u8; PREFIX_LEN] {
        let mut out = [0u8; PREFIX_LEN];
        out[..7].copy_from_slice(MAGIC);
        out[7] = self.version;
        out[8..12].copy_from_slice(&self.header_len.to_le_bytes());
        out[12..20].copy_from_slice(&self.payload_len.to_le_bytes());
        out[20..24].copy_from_slice(&self.payload_crc32.to_le_bytes());
        out
    }

    /// `24 + H + P`, or `None` if that overflows a u64.
    pub fn file_len(&self) -> Option<u64> {
        (PREFIX_LEN as u64)
            .checked_add(u64::from(self.header_len))?
            .checked_add(self.payload_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_round_trips_and_places_each_field_at_its_offset() {
        let prefix = Prefix {
            version: 1,
            header_len: 0x0403_0201,
            payload_len: 0x0C0B_0A09_0807_0605,
            payload_crc32: 0xDDCC_BBAA,
        };
        let bytes = prefix.to_bytes();
        assert_eq!(&bytes[..8], b"DMEXPRT\x01");
        assert_eq!(&bytes[8..12], &[1, 2, 3, 4]);
        assert_eq!(&bytes[12..20], &[5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(&bytes[20..24], &[0xAA, 0xBB, 0xCC, 0xDD]);
        assert_eq!(Prefix::read(&bytes), Some(prefix));
        assert_eq!(Prefix::read(&bytes[..23]), None);
    }

    #[test]
    fn file_len_reports_overflow_instead_of_wrapping() {
        let prefix = Prefix {
            version: 1,
            header_len: 10,
            payload_len: u64::MAX - 20,
            payload_crc32: 0,
        };
        assert_eq!(prefix.file_len(), None);
    }
}
