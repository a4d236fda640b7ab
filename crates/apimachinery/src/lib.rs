//! Pure API machinery: label/field selectors, JSON/merge/strategic-merge patch, Table output, strict field checks.
