//! Value spellings `vllm serve` accepts that clap's own parsers do not: token counts with a
//! suffix (`32k` is 32,000, `32K` is 32,768), `auto` for the model's own length.

/// A count written as vLLM writes it: digits, or a number with `k`/`m`/`g`/`t` (powers of
/// 1000, decimals allowed) or `K`/`M`/`G`/`T` (powers of 1024, whole numbers only).
pub fn human_int(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let Some(suffix) = text.chars().last().filter(char::is_ascii_alphabetic) else {
        return text
            .parse::<usize>()
            .map_err(|_| format!("'{text}' is not a whole number (e.g. 4096, 4k or 4K)"));
    };
    let number = &text[..text.len() - 1];
    let decimal = match suffix {
        'k' => Some(1e3),
        'm' => Some(1e6),
        'g' => Some(1e9),
        't' => Some(1e12),
        _ => None,
    };
    if let Some(multiplier) = decimal {
        let value: f64 = number
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .ok_or_else(|| format!("'{text}' is not a number with a suffix (e.g. 25.6k)"))?;
        return Ok((value * multiplier) as usize);
    }
    let shift = match suffix {
        'K' => 10,
        'M' => 20,
        'G' => 30,
        'T' => 40,
        _ => {
            return Err(format!(
                "'{text}': unknown suffix '{suffix}' (k, m, g, t, K, M, G, T)"
            ))
        }
    };
    let whole: usize = number
        .parse()
        .map_err(|_| format!("'{text}': binary suffixes (K, M, G, T) take whole numbers only"))?;
    whole
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// `--max-model-len`: a length, or `auto` / `-1` for the model's own limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLen(pub Option<usize>);

pub fn model_len(text: &str) -> Result<ModelLen, String> {
    match text.trim() {
        "auto" | "-1" => Ok(ModelLen(None)),
        other => human_int(other).map(|n| ModelLen(Some(n))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_decimal_in_lower_case_and_binary_in_upper_case() {
        assert_eq!(human_int("4096"), Ok(4096));
        assert_eq!(human_int("32k"), Ok(32_000));
        assert_eq!(human_int("32K"), Ok(32_768));
        assert_eq!(human_int("25.6k"), Ok(25_600));
        assert_eq!(human_int("1M"), Ok(1 << 20));
        assert!(human_int("1.5K").is_err());
        assert!(human_int("12x").is_err());
        assert!(human_int("-3").is_err());
        assert_eq!(model_len("auto"), Ok(ModelLen(None)));
        assert_eq!(model_len("-1"), Ok(ModelLen(None)));
        assert_eq!(model_len("8k"), Ok(ModelLen(Some(8000))));
    }
}
