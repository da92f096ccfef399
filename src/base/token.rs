//! Lock tokens: 128 bits from the operating system's CSPRNG, fresh for every acquisition.
//!
//! The token is the lock's value on every node; only its owner can extend or delete the
//! key, because the scripts compare it first. It is printed only shortened (8 hex digits
//! and `…`), so logs and errors never carry a whole token.

use std::fmt;

use crate::base::error::Error;

/// A lock token: 16 random bytes, sent to Redis as 32 lowercase hex characters.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Token {
    hex: [u8; 32],
}

impl Token {
    /// A fresh token from the OS CSPRNG.
    pub(crate) fn generate() -> Result<Token, Error> {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(random_failed)?;
        Ok(Token::from_bytes(raw))
    }

    /// The token for these 16 bytes (the simulator draws them from its seed).
    pub(crate) fn from_bytes(raw: [u8; 16]) -> Token {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hex = [0u8; 32];
        for (i, b) in raw.iter().enumerate() {
            hex[2 * i] = HEX[usize::from(b >> 4)];
            hex[2 * i + 1] = HEX[usize::from(b & 0x0f)];
        }
        Token { hex }
    }

    /// The full token as sent to Redis.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.hex
    }

    /// The first 8 hex digits, for logs.
    pub(crate) fn short(&self) -> &str {
        // The bytes are ASCII hex digits by construction.
        std::str::from_utf8(&self.hex[..8]).unwrap_or("????????")
    }
}

/// The error for a failed OS random source: a fault of the host, never "invalid input".
fn random_failed(e: getrandom::Error) -> Error {
    Error::RandomSource(crate::base::error::RandomSourceError {
        detail: e.to_string(),
    })
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", self.short())
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", self.short())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_random_source_is_not_invalid_input() {
        for e in [
            getrandom::Error::UNSUPPORTED,
            getrandom::Error::new_custom(7),
        ] {
            let err = random_failed(e);
            assert_eq!(err.kind(), crate::ErrorKind::RandomSource);
            assert!(!err.is_retryable());
            assert!(
                err.to_string().contains("random number generator failed"),
                "{err}"
            );
        }
    }

    #[test]
    fn fresh_and_shortened() {
        let a = Token::generate().unwrap();
        let b = Token::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_bytes().len(), 32);
        assert!(a.as_bytes().iter().all(|c| c.is_ascii_hexdigit()));
        let shown = format!("{a:?} {a}");
        assert!(!shown.contains(std::str::from_utf8(a.as_bytes()).unwrap()));
        assert_eq!(format!("{a}").chars().count(), 9);
    }

    #[test]
    fn hex_encoding() {
        let t = Token::from_bytes([0xab; 16]);
        assert_eq!(t.as_bytes(), "ab".repeat(16).as_bytes());
        assert_eq!(t.short(), "abababab");
    }
}
