//! [`Bdf`]: a PCI function's address, `domain:bus:device.function`.

use std::fmt;
use std::str::FromStr;

use super::VfioError;

/// A PCI function's address, as sysfs names it (`0000:00:03.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bdf {
    /// PCI domain (segment): 16 bits on most hosts; VMD's start at
    /// 0x10000, and sysfs names them with as many digits.
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for Bdf {
    type Err = VfioError;

    /// Parses `DDDD:BB:DD.F` (a domain of up to 8 hex digits), or `BB:DD.F`
    /// in domain 0 (hex, as lspci prints).
    fn from_str(s: &str) -> Result<Bdf, VfioError> {
        let bad = || VfioError::BadAddress {
            input: s.to_owned(),
        };
        let parts: Vec<&str> = s.split(':').collect();
        let (domain, bus, devfn) = match parts[..] {
            [d, b, df] => (d, b, df),
            [b, df] => ("0", b, df),
            _ => return Err(bad()),
        };
        let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
        let hex = |x: &str, max_len: usize| -> Result<u32, VfioError> {
            if x.is_empty() || x.len() > max_len || !x.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            u32::from_str_radix(x, 16).map_err(|_| bad())
        };
        let (domain, bus, device, function) =
            (hex(domain, 8)?, hex(bus, 2)?, hex(dev, 2)?, hex(func, 1)?);
        if device > 31 || function > 7 {
            return Err(bad());
        }
        Ok(Bdf {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let b: Bdf = "0000:00:03.0".parse().unwrap();
        assert_eq!(b.to_string(), "0000:00:03.0");
        let b: Bdf = "af:1f.7".parse().unwrap();
        assert_eq!(b.to_string(), "0000:af:1f.7");
        // A VMD domain: printed with its digits, as sysfs names it.
        let b: Bdf = "10000:00:03.0".parse().unwrap();
        assert_eq!(b.to_string(), "10000:00:03.0");
        assert!("123456789:00:03.0".parse::<Bdf>().is_err());
        for bad in [
            "",
            "00:03",
            "0000:00:20.0",
            "0000:00:03.8",
            "zz:00.0",
            "0:0:0:0.0",
        ] {
            let e = bad.parse::<Bdf>().unwrap_err();
            assert!(e.to_string().contains("0000:00:03.0"), "{e}");
        }
    }
}
