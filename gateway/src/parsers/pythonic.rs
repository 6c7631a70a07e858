//! The `pythonic` tool-call format: a reply that is a Python list of calls with keyword
//! arguments given as literals, `[get_weather(city="Paris", days=3), get_time()]`. Arguments
//! become JSON: strings, numbers, `True`/`False`/`None`, lists, tuples and dicts.

use serde_json::{Map, Number, Value};

/// The calls of a reply that is exactly such a list (surrounding whitespace and an optional
/// `<|python_start|>`/`<|python_end|>` pair allowed); `None` when it is anything else.
pub fn calls(text: &str) -> Option<Vec<(String, Value)>> {
    let text = text.trim();
    let text = text
        .strip_prefix("<|python_start|>")
        .map(|t| t.strip_suffix("<|python_end|>").unwrap_or(t))
        .unwrap_or(text)
        .trim();
    let mut p = Parser {
        s: text.as_bytes(),
        at: 0,
    };
    p.expect(b'[')?;
    let mut out = Vec::new();
    loop {
        p.space();
        if p.eat(b']') {
            break;
        }
        if !out.is_empty() {
            p.expect(b',')?;
            p.space();
            if p.eat(b']') {
                break;
            }
        }
        out.push(p.call()?);
    }
    p.space();
    (p.at == p.s.len() && !out.is_empty()).then_some(out)
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn space(&mut self) {
        while self.s.get(self.at).is_some_and(u8::is_ascii_whitespace) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.space();
        if self.s.get(self.at) == Some(&c) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        self.eat(c).then_some(())
    }

    fn ident(&mut self) -> Option<String> {
        self.space();
        let start = self.at;
        while self
            .s
            .get(self.at)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_' || *c == b'.')
        {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    fn call(&mut self) -> Option<(String, Value)> {
        let name = self.ident()?;
        self.expect(b'(')?;
        let mut args = Map::new();
        loop {
            if self.eat(b')') {
                break;
            }
            if !args.is_empty() {
                self.expect(b',')?;
                if self.eat(b')') {
                    break;
                }
            }
            let key = self.ident()?;
            self.expect(b'=')?;
            let value = self.value()?;
            args.insert(key, value);
        }
        Some((name, Value::Object(args)))
    }

    fn value(&mut self) -> Option<Value> {
        self.space();
        match *self.s.get(self.at)? {
            b'"' | b'\'' => self.string().map(Value::String),
            b'[' | b'(' => {
                let close = if self.s[self.at] == b'[' { b']' } else { b')' };
                self.at += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat(close) {
                        break;
                    }
                    if !items.is_empty() {
                        self.expect(b',')?;
                        if self.eat(close) {
                            break;
                        }
                    }
                    items.push(self.value()?);
                }
                Some(Value::Array(items))
            }
            b'{' => {
                self.at += 1;
                let mut map = Map::new();
                loop {
                    if self.eat(b'}') {
                        break;
                    }
                    if !map.is_empty() {
                        self.expect(b',')?;
                        if self.eat(b'}') {
                            break;
                        }
                    }
                    self.space();
                    let key = match self.value()? {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    self.expect(b':')?;
                    map.insert(key, self.value()?);
                }
                Some(Value::Object(map))
            }
            _ => {
                let word = self.word();
                match word.as_str() {
                    "True" => Some(Value::Bool(true)),
                    "False" => Some(Value::Bool(false)),
                    "None" => Some(Value::Null),
                    number => number.parse::<i64>().ok().map(Value::from).or_else(|| {
                        number
                            .parse::<f64>()
                            .ok()
                            .and_then(Number::from_f64)
                            .map(Value::Number)
                    }),
                }
            }
        }
    }

    fn word(&mut self) -> String {
        let start = self.at;
        while self
            .s
            .get(self.at)
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+' | b'_'))
        {
            self.at += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.at]).into_owned()
    }

    fn string(&mut self) -> Option<String> {
        let quote = self.s[self.at];
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let c = *self.s.get(self.at)?;
            self.at += 1;
            match c {
                b'\\' => {
                    let e = *self.s.get(self.at)?;
                    self.at += 1;
                    out.push(match e {
                        b'n' => b'\n',
                        b't' => b'\t',
                        b'r' => b'\r',
                        other => other,
                    });
                }
                c if c == quote => break,
                c => out.push(c),
            }
        }
        String::from_utf8(out).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_calls_become_json_arguments() {
        let got = calls(
            r#"[get_weather(city="Paris", days=3, metric=True, tags=['a', "b"], extra={'k': None}), get_time()]"#,
        )
        .unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "get_weather");
        assert_eq!(
            got[0].1,
            json!({"city": "Paris", "days": 3, "metric": true, "tags": ["a", "b"], "extra": {"k": null}})
        );
        assert_eq!(got[1], ("get_time".to_string(), json!({})));
        assert_eq!(
            calls("<|python_start|>[f(x=1.5)]<|python_end|>").unwrap()[0].1,
            json!({"x": 1.5})
        );
    }

    #[test]
    fn anything_else_is_not_calls() {
        for text in [
            "The weather is nice.",
            "[1, 2]",
            "[f(x=)]",
            "[f(x=1)] and more",
            "[]",
        ] {
            assert!(calls(text).is_none(), "{text}");
        }
    }
}
