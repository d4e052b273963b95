//! The cluster's API token: a secret every agent and client holds (the
//! `token` file of its credentials directory, [`crate::authority::credentials`]),
//! sent as `Authorization: Bearer TOKEN`. Compared in
//! constant time, so how long a refusal takes says nothing of how much of
//! a guess was right.

use std::path::Path;

/// Whether `given` is `expected`, in time that depends only on their
/// lengths.
pub fn matches(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    if a.len() != b.len() || b.is_empty() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token in `path`: its first line, which must hold at least 16
/// characters; the file may be read only by its owner.
pub fn read(path: &Path) -> Result<String, String> {
    crate::authority::files::private(path).map_err(|e| format!("the token file: {e}"))?;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    if meta.len() > 4096 {
        return Err(format!("the token file {} is too large to be a token", path.display()));
    }
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("the token file {} holds no token (16 or more printable characters)", path.display()));
    }
    Ok(token)
}

/// A new random token (32 bytes, hex), written to `path` (mode 0600),
/// which must not exist.
pub fn create(path: &Path) -> Result<String, String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for a token: {e}"))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    crate::authority::files::create(path, format!("{token}\n").as_bytes(), 0o600).map_err(|e| e.to_string())?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_token_matches() {
        assert!(matches("0123456789abcdef", "0123456789abcdef"));
        assert!(!matches("0123456789abcdeF", "0123456789abcdef"));
        assert!(!matches("0123456789abcde", "0123456789abcdef"));
        assert!(!matches("", ""));
    }
}
