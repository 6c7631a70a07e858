//! Case results and the suite report (a table for people, JSON for machines).

use serde::Serialize;
use serde_json::Value;

/// The outcome of one case.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct CaseResult {
    /// A unique, descriptive name.
    pub name: String,
    /// `METHOD /path`.
    pub route: String,
    pub passed: bool,
    /// What the contract requires, in words.
    pub expected: String,
    /// What the server answered, summarised.
    pub got: String,
    /// Why the case failed (empty when it passed).
    pub detail: String,
}

/// All case results of one run, in the order the cases were defined.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Report {
    pub cases: Vec<CaseResult>,
}

impl Report {
    /// True when there is at least one case and every case passed.
    pub fn all_passed(&self) -> bool {
        !self.cases.is_empty() && self.cases.iter().all(|case| case.passed)
    }

    pub fn passed_count(&self) -> usize {
        self.cases.iter().filter(|case| case.passed).count()
    }

    pub fn failed(&self) -> impl Iterator<Item = &CaseResult> {
        self.cases.iter().filter(|case| !case.passed)
    }

    /// The report as JSON: `{"passed": n, "failed": m, "cases": [...]}`.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "passed": self.passed_count(),
            "failed": self.cases.len() - self.passed_count(),
            "cases": self.cases,
        })
    }

    /// A pass/fail table: one line per case, failures followed by what was expected,
    /// what came back and why it failed; a summary line last.
    pub fn render_table(&self) -> String {
        let route_width = column_width(self.cases.iter().map(|c| c.route.as_str()), 44);
        let mut out = String::new();
        out.push_str(&format!(
            "{:<6} {:<route_width$} {}\n",
            "RESULT", "ROUTE", "CASE"
        ));
        for case in &self.cases {
            let mark = if case.passed { "PASS" } else { "FAIL" };
            out.push_str(&format!(
                "{mark:<6} {:<route_width$} {}\n",
                case.route, case.name
            ));
            if !case.passed {
                out.push_str(&format!("         expected: {}\n", case.expected));
                out.push_str(&format!("         got:      {}\n", case.got));
                if !case.detail.is_empty() {
                    out.push_str(&format!("         detail:   {}\n", case.detail));
                }
            }
        }
        out.push_str(&format!(
            "{} passed, {} failed, {} total\n",
            self.passed_count(),
            self.cases.len() - self.passed_count(),
            self.cases.len()
        ));
        out
    }

    /// Prints [`Report::render_table`] to stdout.
    pub fn print_table(&self) {
        print!("{}", self.render_table());
    }
}

fn column_width<'a>(values: impl Iterator<Item = &'a str>, cap: usize) -> usize {
    values.map(str::len).max().unwrap_or(5).clamp(5, cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(name: &str, passed: bool) -> CaseResult {
        CaseResult {
            name: name.into(),
            route: "POST /v1/chat/completions".into(),
            passed,
            expected: "200".into(),
            got: if passed { "200".into() } else { "500".into() },
            detail: if passed {
                String::new()
            } else {
                "status 500 != 200".into()
            },
        }
    }

    #[test]
    fn empty_report_has_not_passed() {
        assert!(!Report::default().all_passed());
    }

    #[test]
    fn table_and_json_show_failures() {
        let report = Report {
            cases: vec![case("a", true), case("b", false)],
        };
        assert!(!report.all_passed());
        let table = report.render_table();
        assert!(table.contains("PASS"));
        assert!(table.contains("FAIL"));
        assert!(table.contains("status 500 != 200"));
        assert!(table.contains("1 passed, 1 failed, 2 total"));
        let json = report.to_json();
        assert_eq!(json["passed"], 1);
        assert_eq!(json["failed"], 1);
        assert_eq!(json["cases"][1]["name"], "b");
        assert_eq!(json["cases"][1]["passed"], false);
    }
}
