//! `k8s.io/apimachinery/pkg/util/duration.HumanDuration`: the AGE column's format.

/// Formats a signed number of seconds as upstream's `HumanDuration` does (`45s`, `3m20s`,
/// `15m`, `5h30m`, `20h`, `3d4h`, `40d`, `2y30d`, `9y`). More than a second in the future is
/// `<invalid>` (clock skew below 2 s is tolerated as `0s`).
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn upstream_cases() {
        let m = 60;
        let h = 3600;
        let d = 24 * h;
        let y = 365 * d;
        let cases = [
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (1, "1s"),
            (119, "119s"),
            (2 * m, "2m"),
            (2 * m + 1, "2m1s"),
            (9 * m + 59, "9m59s"),
            (10 * m, "10m"),
            (3 * h - 1, "179m"),
            (3 * h, "3h"),
            (3 * h + 30 * m, "3h30m"),
            (8 * h - 1, "7h59m"),
            (8 * h, "8h"),
            (47 * h + 59 * m, "47h"),
            (48 * h, "2d"),
            (48 * h + h, "2d1h"),
            (8 * d - 1, "7d23h"),
            (8 * d, "8d"),
            (2 * y - 1, "729d"),
            (2 * y, "2y"),
            (2 * y + 30 * d, "2y30d"),
            (8 * y - 1, "7y364d"),
            (8 * y, "8y"),
            (100 * y, "100y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }
}
