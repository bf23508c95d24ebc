//! Bytes as people read and type them: a `hexdump -C` style dump, and hex
//! byte strings parsed (`ntb-tool mw read` / `mw write`).

use std::fmt::Write as _;

/// Renders `bytes`, which start at window offset `base`, as `hexdump -C`
/// does: 16 bytes a line, the offset, the bytes in hex (two groups of
/// eight), then the printable ASCII.
///
/// ```
/// let d = ntbdk_apps::tool::hexdump::hexdump(0x10, b"NTB!");
/// assert_eq!(d, "00000010  4e 54 42 21                                       |NTB!|\n");
/// ```
pub fn hexdump(base: usize, bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, line) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x} ", base + i * 16);
        for j in 0..16 {
            if j == 8 {
                out.push(' ');
            }
            match line.get(j) {
                Some(b) => {
                    let _ = write!(out, " {b:02x}");
                }
                None => out.push_str("   "),
            }
        }
        out.push_str("  |");
        out.extend(line.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        }));
        out.push_str("|\n");
    }
    out
}

/// Parses a hex byte string: `deadbeef`, `0xdeadbeef`, `de:ad:be:ef` or
/// `de ad be ef` (`_` too), in the order written; at least one byte.
pub fn parse_hex_bytes(s: &str) -> Result<Vec<u8>, String> {
    let t = s.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    let digits: Vec<u8> = t
        .bytes()
        .filter(|b| !matches!(b, b':' | b' ' | b'_' | b'-'))
        .collect();
    if digits.is_empty() || !digits.len().is_multiple_of(2) {
        return Err(format!(
            "{s:?} is not a whole number of hex bytes (two hex digits each, e.g. de:ad:be:ef)"
        ));
    }
    digits
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok())
                .ok_or_else(|| {
                    format!(
                        "{s:?}: {:?} is not a hex byte",
                        String::from_utf8_lossy(pair)
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumps_lines_of_sixteen_with_ascii() {
        let bytes: Vec<u8> = (0x40..0x40 + 20).collect();
        let d = hexdump(0x100, &bytes);
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), 2, "{d}");
        assert_eq!(
            lines[0],
            "00000100  40 41 42 43 44 45 46 47  48 49 4a 4b 4c 4d 4e 4f  |@ABCDEFGHIJKLMNO|"
        );
        assert_eq!(
            lines[1],
            "00000110  50 51 52 53                                       |PQRS|"
        );
        assert_eq!(
            hexdump(0, &[0, 0xff]).find('|'),
            Some(60),
            "ASCII column aligned"
        );
        assert!(hexdump(0, &[0, 0xff]).ends_with("|..|\n"));
        assert_eq!(hexdump(0, &[]), "");
    }

    #[test]
    fn hex_bytes_parse_in_the_usual_spellings() {
        let want = Ok(vec![0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(parse_hex_bytes("deadbeef"), want);
        assert_eq!(parse_hex_bytes("0xDEADBEEF"), want);
        assert_eq!(parse_hex_bytes("de:ad:be:ef"), want);
        assert_eq!(parse_hex_bytes("de ad be ef"), want);
        assert_eq!(parse_hex_bytes("00"), Ok(vec![0]));
        assert!(parse_hex_bytes("abc").unwrap_err().contains("whole number"));
        assert!(parse_hex_bytes("").is_err());
        assert!(parse_hex_bytes("zz").unwrap_err().contains("\"zz\""));
    }
}
