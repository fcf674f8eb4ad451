//! Byte sizes on the command line: a number with an optional binary
//! suffix (`K`, `M`, `G`, `T`, optionally followed by `iB` or `B`).
//!
//! Invariant: a result is exact or an error; overflow is an error.

/// Parse `"1G"`, `"512M"`, `"4KiB"`, `"4096"` into bytes (powers of 1024).
///
/// ```
/// assert_eq!(kxarray_nbd::parse_size("1G"), Ok(1 << 30));
/// assert_eq!(kxarray_nbd::parse_size("4KiB"), Ok(4096));
/// assert!(kxarray_nbd::parse_size("1X").is_err());
/// ```
///
/// # Errors
/// A message naming the problem: empty, no digits, unknown suffix,
/// overflow.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits == 0 {
        return Err(format!("size {s:?} does not start with a number"));
    }
    let n: u64 = s[..digits]
        .parse()
        .map_err(|e| format!("size {s:?}: {e}"))?;
    let suffix = s[digits..].trim().to_ascii_uppercase();
    let unit = suffix.trim_end_matches("IB").trim_end_matches('B');
    let shift = match unit {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "size {s:?}: unknown suffix {:?} (use K, M, G or T)",
                &s[digits..]
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} overflows 64 bits"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn suffixes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("3M"), Ok(3 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("1Q").is_err());
        assert!(parse_size("1KK").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
