//! A NIC's MAC address as people and files write it (`52:54:00:12:34:56`):
//! on the command line, in snapshots' device lists and in log headers.

/// Why a text is not a NIC's MAC address. (Written by hand: the crate
/// needs no error library for two variants.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MacError {
    /// Not six hex bytes separated by colons.
    Unreadable(String),
    /// A multicast address, which no NIC may have.
    Multicast(String),
}

impl std::fmt::Display for MacError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            MacError::Unreadable(s) => {
                write!(f, "invalid MAC address '{s}' (use six hex bytes like 52:54:00:12:34:56)")
            }
            MacError::Multicast(s) => write!(f, "MAC address '{s}' is a multicast address; a NIC needs a unicast one"),
        }
    }
}

impl std::error::Error for MacError {}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], MacError> {
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || MacError::Unreadable(s.to_string());
    if parts.len() != 6 {
        return Err(bad());
    }
    let mut mac = [0u8; 6];
    for (m, p) in mac.iter_mut().zip(parts) {
        if p.len() != 2 {
            return Err(bad());
        }
        *m = u8::from_str_radix(p, 16).map_err(|_| bad())?;
    }
    if mac[0] & 1 != 0 {
        return Err(MacError::Multicast(s.to_string()));
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs() {
        assert_eq!(parse_mac("52:54:00:ab:CD:ef").unwrap(), [0x52, 0x54, 0, 0xab, 0xcd, 0xef]);
        assert_eq!(format_mac(&[0x52, 0x54, 0, 0xab, 0xcd, 0xef]), "52:54:00:ab:cd:ef");
        for bad in ["", "52:54:00:ab:cd", "52:54:00:ab:cd:ef:01", "zz:54:00:ab:cd:ef", "5:54:00:ab:cd:ef"] {
            assert!(parse_mac(bad).is_err(), "{bad}");
        }
        assert!(parse_mac("01:00:5e:00:00:01").unwrap_err().to_string().contains("multicast"));
    }
}
