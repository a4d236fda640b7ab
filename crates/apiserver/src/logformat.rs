//! Reading container log files in the CRI logging format the node agent writes (one record
//! per line: `<RFC 3339 time> <stdout|stderr> <F|P> <text>`, `F` ending a line and `P` a piece
//! of a longer one) into what `kubectl logs` shows: the text, with each record's time in front
//! when `timestamps` is asked, without the records older than `sinceSeconds`/`sinceTime`.
//! A line that is not a record (a log written before the agent recorded times) passes
//! through as it is. Pure: the caller reads the file.

use jiff::Timestamp;

/// How records are shown.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogFormat {
    pub timestamps: bool,
    /// Records before this time are left out.
    pub since: Option<Timestamp>,
}

/// One parsed record.
#[derive(Debug, PartialEq, Eq)]
struct Record<'a> {
    time: Timestamp,
    time_text: &'a [u8],
    full: bool,
    text: &'a [u8],
}

fn parse(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, |&b| b == b' ');
    let time_text = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    let text = parts.next().unwrap_or(&[]);
    if stream != b"stdout" && stream != b"stderr" {
        return None;
    }
    let full = match tag {
        b"F" => true,
        b"P" => false,
        _ => return None,
    };
    let time = std::str::from_utf8(time_text).ok()?.parse().ok()?;
    Some(Record {
        time,
        time_text,
        full,
        text,
    })
}

/// Turns the bytes of a log file, as they are read, into what the client sees.
#[derive(Debug, Default)]
pub struct LogReader {
    format: LogFormat,
    partial: Vec<u8>,
}

impl LogReader {
    pub fn new(format: LogFormat) -> Self {
        LogReader {
            format,
            partial: Vec::new(),
        }
    }

    /// The output of the complete lines in what has been read so far (`data` appended).
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        self.partial.extend_from_slice(data);
        let Some(last) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        let rest = self.partial.split_off(last + 1);
        let lines = std::mem::replace(&mut self.partial, rest);
        let mut out = Vec::with_capacity(lines.len());
        // `lines` ends with its last newline: without it, `split` yields exactly the lines.
        for line in lines[..lines.len() - 1].split(|&b| b == b'\n') {
            self.line(line, &mut out);
        }
        out
    }

    /// The output of a final line without a newline (the end of a log that is not followed).
    pub fn finish(&mut self) -> Vec<u8> {
        let line = std::mem::take(&mut self.partial);
        let mut out = Vec::new();
        if !line.is_empty() {
            self.line(&line, &mut out);
            // A plain last line had no newline in the file; give none back.
            if parse(&line).is_none() {
                out.pop();
            }
        }
        out
    }

    fn line(&self, line: &[u8], out: &mut Vec<u8>) {
        match parse(line) {
            Some(r) => {
                if self.format.since.is_some_and(|s| r.time < s) {
                    return;
                }
                if self.format.timestamps {
                    out.extend_from_slice(r.time_text);
                    out.push(b' ');
                }
                out.extend_from_slice(r.text);
                if r.full {
                    out.push(b'\n');
                }
            }
            None => {
                out.extend_from_slice(line);
                out.push(b'\n');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "2026-12-02T01:00:00.5Z stdout F first\n\
                       2026-12-02T01:00:01Z stderr P sec\n\
                       2026-12-02T01:00:01Z stderr F ond\n\
                       2026-12-02T01:00:02.123456789Z stdout F third\n";

    fn read(format: LogFormat, text: &str, step: usize) -> String {
        let mut r = LogReader::new(format);
        let mut out = Vec::new();
        for chunk in text.as_bytes().chunks(step) {
            out.extend(r.feed(chunk));
        }
        out.extend(r.finish());
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn records_become_lines_whatever_the_reads() {
        for step in [1, 3, 7, 1000] {
            assert_eq!(
                read(LogFormat::default(), LOG, step),
                "first\nsecond\nthird\n"
            );
        }
    }

    #[test]
    fn timestamps_and_since() {
        let ts = LogFormat {
            timestamps: true,
            since: None,
        };
        assert_eq!(
            read(ts, LOG, 5),
            "2026-12-02T01:00:00.5Z first\n2026-12-02T01:00:01Z sec2026-12-02T01:00:01Z ond\n2026-12-02T01:00:02.123456789Z third\n"
        );
        let since = LogFormat {
            timestamps: false,
            since: Some("2026-12-02T01:00:01Z".parse().unwrap()),
        };
        assert_eq!(read(since, LOG, 4), "second\nthird\n");
    }

    #[test]
    fn plain_lines_pass_through() {
        assert_eq!(read(LogFormat::default(), "a\nb\n", 1), "a\nb\n");
        assert_eq!(read(LogFormat::default(), "a\nb", 2), "a\nb");
        assert_eq!(
            read(LogFormat::default(), "x stdout F y\nnot a record\n", 3),
            "x stdout F y\nnot a record\n"
        );
    }
}
