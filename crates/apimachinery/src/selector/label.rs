//! Label selectors: the string syntax of `k8s.io/apimachinery/pkg/labels` (lexer, parser,
//! requirement validation, canonical printing) and the structured `metav1.LabelSelector`.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

use super::SelectorError;
use super::validation::{label_key_errors, label_value_errors};

/// The operator of one label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LabelOp {
    /// `key=value`
    Equals,
    /// `key==value` (same meaning as `=`; kept so the selector prints back as written)
    DoubleEquals,
    /// `key!=value`: the key is absent or has another value.
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)`: the key is absent or has none of the values.
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key>5`: the label's value is an integer greater than 5.
    GreaterThan,
    /// `key<5`: the label's value is an integer less than 5.
    LessThan,
}

/// One requirement of a label selector: a key, an operator and its values (sorted, deduplicated).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LabelRequirement {
    key: String,
    op: LabelOp,
    values: Vec<String>,
}

impl LabelRequirement {
    /// Builds and validates a requirement with upstream's rules on value counts, key and values.
    pub fn new(key: &str, op: LabelOp, values: Vec<String>) -> Result<Self, SelectorError> {
        let errs = label_key_errors(key);
        if !errs.is_empty() {
            return Err(SelectorError::InvalidKey {
                key: key.to_string(),
                reason: errs.join("; "),
            });
        }
        let n = values.len();
        match op {
            LabelOp::In | LabelOp::NotIn if n == 0 => {
                return Err(SelectorError::Requirement {
                    key: key.to_string(),
                    reason: "for 'in', 'notin' operators, values set can't be empty".into(),
                });
            }
            LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::NotEquals if n != 1 => {
                return Err(SelectorError::Requirement {
                    key: key.to_string(),
                    reason: "exact-match compatibility requires one single value".into(),
                });
            }
            LabelOp::Exists | LabelOp::DoesNotExist if n != 0 => {
                return Err(SelectorError::Requirement {
                    key: key.to_string(),
                    reason: "values set must be empty for exists and does not exist".into(),
                });
            }
            LabelOp::GreaterThan | LabelOp::LessThan => {
                if n != 1 {
                    return Err(SelectorError::Requirement {
                        key: key.to_string(),
                        reason: "for 'Gt', 'Lt' operators, exactly one value is required".into(),
                    });
                }
                if values[0].parse::<i64>().is_err() {
                    return Err(SelectorError::Requirement {
                        key: key.to_string(),
                        reason: format!(
                            "for 'Gt', 'Lt' operators, the value must be an integer, not {:?}",
                            values[0]
                        ),
                    });
                }
            }
            _ => {}
        }
        if !matches!(op, LabelOp::GreaterThan | LabelOp::LessThan) {
            for v in &values {
                let errs = label_value_errors(v);
                if !errs.is_empty() {
                    return Err(SelectorError::InvalidValue {
                        key: key.to_string(),
                        value: v.clone(),
                        reason: errs.join("; "),
                    });
                }
            }
        }
        let mut values = values;
        values.sort();
        values.dedup();
        Ok(LabelRequirement {
            key: key.to_string(),
            op,
            values,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn op(&self) -> LabelOp {
        self.op
    }

    pub fn values(&self) -> &[String] {
        &self.values
    }

    /// Whether this requirement holds for a label set, with upstream's semantics: `!=` and
    /// `notin` hold when the key is absent; `>`/`<` need an integer value.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let got = labels.get(&self.key);
        let has = |v: &String| self.values.iter().any(|x| x == v);
        match self.op {
            LabelOp::Equals | LabelOp::DoubleEquals | LabelOp::In => got.is_some_and(has),
            LabelOp::NotEquals | LabelOp::NotIn => !got.is_some_and(has),
            LabelOp::Exists => got.is_some(),
            LabelOp::DoesNotExist => got.is_none(),
            LabelOp::GreaterThan | LabelOp::LessThan => {
                let (Some(got), Some(want)) = (
                    got.and_then(|g| g.parse::<i64>().ok()),
                    self.values.first().and_then(|w| w.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.op == LabelOp::GreaterThan {
                    got > want
                } else {
                    got < want
                }
            }
        }
    }
}

impl fmt::Display for LabelRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let first = self.values.first().map(String::as_str).unwrap_or("");
        match self.op {
            LabelOp::Equals => write!(f, "{}={first}", self.key),
            LabelOp::DoubleEquals => write!(f, "{}=={first}", self.key),
            LabelOp::NotEquals => write!(f, "{}!={first}", self.key),
            LabelOp::GreaterThan => write!(f, "{}>{first}", self.key),
            LabelOp::LessThan => write!(f, "{}<{first}", self.key),
            LabelOp::In => write!(f, "{} in ({})", self.key, self.values.join(",")),
            LabelOp::NotIn => write!(f, "{} notin ({})", self.key, self.values.join(",")),
            LabelOp::Exists => write!(f, "{}", self.key),
            LabelOp::DoesNotExist => write!(f, "!{}", self.key),
        }
    }
}

/// A label selector: the conjunction of its requirements. Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// The selector that matches every label set.
    pub fn everything() -> Self {
        Self::default()
    }

    /// Builds a selector from requirements, sorted by key as upstream does.
    pub fn from_requirements(mut requirements: Vec<LabelRequirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        LabelSelector { requirements }
    }

    /// Parses the string syntax (`a=b,c!=d,e in (f,g),!h,i`), as `labels.Parse` does.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let tokens = lex(s)?;
        Parser {
            input: s,
            tokens,
            pos: 0,
        }
        .parse()
        .map(Self::from_requirements)
    }

    /// The equality selector of a Service (`spec.selector`) or a ReplicationController.
    /// Keys and values are not validated (the API server validates them on write).
    pub fn from_map(map: &BTreeMap<String, String>) -> LabelSelector {
        Self::from_requirements(
            map.iter()
                .map(|(k, v)| LabelRequirement {
                    key: k.clone(),
                    op: LabelOp::Equals,
                    values: vec![v.clone()],
                })
                .collect(),
        )
    }

    /// Converts a structured `metav1.LabelSelector` (`matchLabels` + `matchExpressions`), as
    /// `metav1.LabelSelectorAsSelector` does. An empty one selects everything.
    pub fn from_k8s(sel: &metav1::LabelSelector) -> Result<LabelSelector, SelectorError> {
        let mut reqs = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            reqs.push(LabelRequirement::new(k, LabelOp::Equals, vec![v.clone()])?);
        }
        for expr in sel.match_expressions.iter().flatten() {
            let op = match expr.operator.as_str() {
                "In" => LabelOp::In,
                "NotIn" => LabelOp::NotIn,
                "Exists" => LabelOp::Exists,
                "DoesNotExist" => LabelOp::DoesNotExist,
                other => {
                    return Err(SelectorError::Requirement {
                        key: expr.key.clone(),
                        reason: format!("{other:?} is not a valid label selector operator"),
                    });
                }
            };
            reqs.push(LabelRequirement::new(
                &expr.key,
                op,
                expr.values.clone().unwrap_or_default(),
            )?);
        }
        Ok(Self::from_requirements(reqs))
    }

    pub fn requirements(&self) -> &[LabelRequirement] {
        &self.requirements
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether every requirement holds for the label set.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    Bang,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Open,
    Close,
    Comma,
    End,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(s) => f.write_str(s),
            Token::Bang => f.write_str("!"),
            Token::Eq => f.write_str("="),
            Token::DoubleEq => f.write_str("=="),
            Token::NotEq => f.write_str("!="),
            Token::Gt => f.write_str(">"),
            Token::Lt => f.write_str("<"),
            Token::Open => f.write_str("("),
            Token::Close => f.write_str(")"),
            Token::Comma => f.write_str(","),
            Token::End => f.write_str("end of string"),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(s: &str) -> Result<Vec<Token>, SelectorError> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if is_special(c) {
            chars.next();
            let next = chars.peek().copied();
            let tok = match (c, next) {
                ('=', Some('=')) => {
                    chars.next();
                    Token::DoubleEq
                }
                ('!', Some('=')) => {
                    chars.next();
                    Token::NotEq
                }
                ('=', _) => Token::Eq,
                ('!', _) => Token::Bang,
                ('(', _) => Token::Open,
                (')', _) => Token::Close,
                (',', _) => Token::Comma,
                ('>', _) => Token::Gt,
                ('<', _) => Token::Lt,
                _ => {
                    return Err(SelectorError::Syntax {
                        selector: s.to_string(),
                        reason: format!("unexpected character {c:?}"),
                    });
                }
            };
            out.push(tok);
            continue;
        }
        let mut ident = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() || is_special(c) {
                break;
            }
            ident.push(c);
            chars.next();
        }
        out.push(Token::Ident(ident));
    }
    out.push(Token::End);
    Ok(out)
}

struct Parser<'a> {
    input: &'a str,
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        self.pos += 1;
        t
    }

    fn err(&self, reason: String) -> SelectorError {
        SelectorError::Syntax {
            selector: self.input.to_string(),
            reason,
        }
    }

    fn parse(mut self) -> Result<Vec<LabelRequirement>, SelectorError> {
        let mut reqs = Vec::new();
        loop {
            match self.peek() {
                Token::Ident(_) | Token::Bang => {
                    reqs.push(self.requirement()?);
                    match self.next() {
                        Token::End => return Ok(reqs),
                        Token::Comma => match self.peek() {
                            Token::Ident(_) | Token::Bang => {}
                            t => {
                                return Err(self
                                    .err(format!("found '{t}', expected: identifier after ','")));
                            }
                        },
                        t => {
                            return Err(
                                self.err(format!("found '{t}', expected: ',' or 'end of string'"))
                            );
                        }
                    }
                }
                Token::End => return Ok(reqs),
                t => {
                    return Err(self.err(format!(
                        "found '{t}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<LabelRequirement, SelectorError> {
        let negated = self.peek() == &Token::Bang;
        if negated {
            self.next();
        }
        let key = match self.next() {
            Token::Ident(k) => k,
            t => return Err(self.err(format!("found '{t}', expected: identifier"))),
        };
        if negated {
            return LabelRequirement::new(&key, LabelOp::DoesNotExist, vec![]);
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return LabelRequirement::new(&key, LabelOp::Exists, vec![]);
        }
        let op = match self.next() {
            Token::Eq => LabelOp::Equals,
            Token::DoubleEq => LabelOp::DoubleEquals,
            Token::NotEq => LabelOp::NotEquals,
            Token::Gt => LabelOp::GreaterThan,
            Token::Lt => LabelOp::LessThan,
            Token::Ident(w) if w == "in" => LabelOp::In,
            Token::Ident(w) if w == "notin" => LabelOp::NotIn,
            t => {
                return Err(self.err(format!(
                    "found '{t}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            }
        };
        let values = if matches!(op, LabelOp::In | LabelOp::NotIn) {
            self.value_set()?
        } else {
            match self.peek().clone() {
                Token::End | Token::Comma => vec![String::new()],
                Token::Ident(v) => {
                    self.next();
                    vec![v]
                }
                t => return Err(self.err(format!("found '{t}', expected: identifier"))),
            }
        };
        LabelRequirement::new(&key, op, values)
    }

    /// `( v1, v2 )`; as upstream, `()` and a trailing comma mean the empty value.
    fn value_set(&mut self) -> Result<Vec<String>, SelectorError> {
        match self.next() {
            Token::Open => {}
            t => return Err(self.err(format!("found '{t}', expected: '('"))),
        }
        let mut values = Vec::new();
        loop {
            match self.next() {
                Token::Ident(v) => {
                    values.push(v);
                    match self.next() {
                        Token::Comma => {
                            if self.peek() == &Token::Close {
                                values.push(String::new());
                            }
                        }
                        Token::Close => return Ok(values),
                        t => {
                            return Err(self.err(format!("found '{t}', expected: ',', or ')'")));
                        }
                    }
                }
                Token::Close => {
                    if values.is_empty() {
                        values.push(String::new());
                    }
                    return Ok(values);
                }
                Token::Comma => values.push(String::new()),
                t => {
                    return Err(self.err(format!("found '{t}', expected: ',', ')' or identifier")));
                }
            }
        }
    }
}
