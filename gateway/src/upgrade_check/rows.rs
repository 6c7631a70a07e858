//! The rows of the upgrade check: one acceptance condition each, printed as one table for
//! people and written as JSON for CI.

use serde::Serialize;

/// How a condition came out. Only `Fail` fails the check: `Warn` is a finding that does not
/// stop the upgrade (a flag with no effect, a deprecated one), `Skip` a condition that does
/// not apply to this deployment (no weight cache configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Skip,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Skip => "SKIP",
            Status::Fail => "FAIL",
        }
    }
}

/// One acceptance condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// `contract`, `trust`, `config`, `weight-cache`, `router`, `output`.
    pub section: &'static str,
    /// What is checked, e.g. `POST /v1/chat/completions` or `--swap-space`.
    pub check: String,
    pub status: Status,
    /// What was found; for a failure, why.
    pub detail: String,
}

impl Row {
    pub fn new(
        section: &'static str,
        check: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            section,
            check: check.into(),
            status,
            detail: detail.into(),
        }
    }

    /// `Pass` with `Ok`'s text, `Fail` with `Err`'s.
    pub fn judged(
        section: &'static str,
        check: impl Into<String>,
        outcome: Result<String, String>,
    ) -> Self {
        match outcome {
            Ok(detail) => Self::new(section, check, Status::Pass, detail),
            Err(detail) => Self::new(section, check, Status::Fail, detail),
        }
    }
}

/// Every row, in the order printed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Table {
    pub rows: Vec<Row>,
}

impl Table {
    /// True when there is a row and none failed.
    pub fn passed(&self) -> bool {
        !self.rows.is_empty() && self.rows.iter().all(|row| row.status != Status::Fail)
    }

    fn count(&self, status: Status) -> usize {
        self.rows.iter().filter(|row| row.status == status).count()
    }

    /// `{"passed": bool, "rows": [{section, check, status, detail}, ...]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"passed": self.passed(), "rows": self.rows})
    }

    /// The table: a line per row, the detail wrapped under it, then the totals.
    pub fn render(&self) -> String {
        let section = width(self.rows.iter().map(|r| r.section), 12);
        let check = width(self.rows.iter().map(|r| r.check.as_str()), 44);
        let mut out = format!(
            "{:<6} {:<section$} {:<check$} DETAIL\n",
            "RESULT", "SECTION", "CHECK"
        );
        for row in &self.rows {
            out.push_str(&format!(
                "{:<6} {:<section$} {:<check$} {}\n",
                row.status.label(),
                row.section,
                row.check,
                row.detail
            ));
        }
        out.push_str(&format!(
            "{} pass, {} warn, {} skip, {} fail: {}\n",
            self.count(Status::Pass),
            self.count(Status::Warn),
            self.count(Status::Skip),
            self.count(Status::Fail),
            if self.passed() {
                "the deployment meets the upgrade's acceptance conditions"
            } else {
                "NOT ready"
            }
        ));
        out
    }
}

fn width<'a>(values: impl Iterator<Item = &'a str>, cap: usize) -> usize {
    values.map(str::len).max().unwrap_or(5).clamp(5, cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failure_fails_and_an_empty_table_does_not_pass() {
        assert!(!Table::default().passed());
        let mut table = Table {
            rows: vec![
                Row::new("config", "--enforce-eager", Status::Warn, "no effect"),
                Row::new("weight-cache", "daemon health", Status::Skip, "none"),
                Row::judged("output", "m", Ok("text".into())),
            ],
        };
        assert!(table.passed());
        table
            .rows
            .push(Row::judged("trust", "kwargs", Err("trusted".into())));
        assert!(!table.passed());
        let text = table.render();
        assert!(text.contains("FAIL   trust"), "{text}");
        assert!(
            text.contains("1 pass, 1 warn, 1 skip, 1 fail: NOT ready"),
            "{text}"
        );
        let json = table.to_json();
        assert_eq!(json["passed"], false);
        assert_eq!(json["rows"][3]["status"], "fail");
        assert_eq!(json["rows"][3]["section"], "trust");
    }
}
