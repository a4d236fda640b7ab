//! Label key and value validation, as `k8s.io/apimachinery/pkg/util/validation` does it
//! (`IsQualifiedName`, `IsValidLabelValue`), with upstream's wording in the messages.

/// The longest label value and the longest name part of a qualified name.
const MAX_NAME_LEN: usize = 63;
/// The longest DNS-1123 subdomain (the optional prefix of a qualified name).
const MAX_PREFIX_LEN: usize = 253;

const NAME_FMT_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', \
and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', \
regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

const VALUE_FMT_MSG: &str = "a valid label must be an empty string or consist of alphanumeric \
characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  \
or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. \
'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the shape of a label value and of a name part.
fn is_qualified_name_part(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// A lowercase RFC 1123 subdomain: dot-separated labels of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_PREFIX_LEN
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(f), Some(l)) => {
                    (f.is_ascii_lowercase() || f.is_ascii_digit())
                        && (l.is_ascii_lowercase() || l.is_ascii_digit())
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

/// Validates a label key (`prefix/name` or `name`); returns upstream's reasons when invalid.
pub(crate) fn label_key_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = key.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else if prefix.len() > MAX_PREFIX_LEN {
                errs.push(format!(
                    "prefix part must be no more than {MAX_PREFIX_LEN} characters"
                ));
            } else if !is_dns1123_subdomain(prefix) {
                errs.push(format!("prefix part {DNS1123_SUBDOMAIN_MSG}"));
            }
            *name
        }
        _ => {
            errs.push(
                "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must \
start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used \
for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix \
and '/' (e.g. 'example.com/MyName')"
                    .to_string(),
            );
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > MAX_NAME_LEN {
        errs.push(format!(
            "name part must be no more than {MAX_NAME_LEN} characters"
        ));
    }
    if !name.is_empty() && !is_qualified_name_part(name) {
        errs.push(NAME_FMT_MSG.to_string());
    }
    errs
}

/// Validates a label value (empty is allowed); returns upstream's reasons when invalid.
pub(crate) fn label_value_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > MAX_NAME_LEN {
        errs.push(format!("must be no more than {MAX_NAME_LEN} characters"));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(VALUE_FMT_MSG.to_string());
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        for ok in [
            "app",
            "a",
            "app.kubernetes.io/name",
            "kubernetes.io/service-name",
            "A_b.c-9",
            "x/y",
        ] {
            assert!(label_key_errors(ok).is_empty(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a/b/c",
            "/a",
            "Example.com/a",
            "a/",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(!label_key_errors(bad).is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn values() {
        for ok in ["", "v", "v1.2_3-x", &"x".repeat(63)] {
            assert!(label_value_errors(ok).is_empty(), "{ok}");
        }
        for bad in ["-", "a b", "a/b", ".a", &"x".repeat(64)] {
            assert!(!label_value_errors(bad).is_empty(), "{bad:?}");
        }
    }
}
