//! The line and CSV reader both bills share: physical lines, encodings, headers, cells, amounts.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::{BufRead, Read};

use chrono::{NaiveDate, NaiveDateTime};
use csv_core::ReadFieldResult;
use encoding_rs::GBK;

use super::{BillError, BillKind, BillRow, BillSummary, MAX_LINE_BYTES};
use crate::domain::money::{format_yuan, parse_yuan};

/// The timestamp format of both bills.
pub(super) const TIME_FORMAT: &str = "%Y-%m-%d %H:%M:%S";
/// The same with slashes, as a spreadsheet re-save tends to write it. Accepted, never written.
const TIME_FORMAT_SLASHES: &str = "%Y/%m/%d %H:%M:%S";

/// Reads physical lines into one reused buffer, counting them.
pub(super) struct Lines<R> {
    input: R,
    buf: Vec<u8>,
    line: usize,
}

impl<R: BufRead> Lines<R> {
    pub(super) fn new(input: R) -> Self {
        Lines {
            input,
            buf: Vec::new(),
            line: 0,
        }
    }

    /// The number of the line after the last one read: where the end of the file is reported.
    pub(super) fn eof_line(&self) -> usize {
        self.line + 1
    }

    /// The next line with its number, without its LF/CRLF end (and without a BOM on line 1).
    pub(super) fn next_line(&mut self) -> Result<Option<(usize, &[u8])>, BillError> {
        let number = self.line + 1;
        self.buf.clear();
        let read = (&mut self.input)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| BillError::new(number, format!("cannot read the bill: {e}")))?;
        if read == 0 {
            return Ok(None);
        }
        self.line = number;
        let mut bytes = match self.buf.strip_suffix(b"\n") {
            Some(bytes) => bytes,
            None if self.buf.len() > MAX_LINE_BYTES => {
                return Err(BillError::new(
                    number,
                    format!("line longer than {MAX_LINE_BYTES} bytes"),
                ));
            }
            None => &self.buf[..],
        };
        bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        if number == 1 {
            bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        }
        Ok(Some((number, bytes)))
    }
}

/// The text encoding of a bill, decided by the first line with non-ASCII bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Encoding {
    #[default]
    Undecided,
    Utf8,
    Gbk,
}

/// Decodes lines one at a time (see "Encoding" in the module documentation).
#[derive(Debug, Default)]
pub(super) struct Decoder {
    encoding: Encoding,
}

impl Decoder {
    pub(super) fn decode<'a>(&mut self, line: usize, bytes: &'a [u8]) -> Result<Cow<'a, str>, BillError> {
        if bytes.is_ascii() {
            // ASCII reads the same in both encodings and decides nothing.
            return Ok(Cow::Borrowed(std::str::from_utf8(bytes).unwrap_or_default()));
        }
        match (self.encoding, std::str::from_utf8(bytes)) {
            (Encoding::Undecided | Encoding::Utf8, Ok(text)) => {
                self.encoding = Encoding::Utf8;
                Ok(Cow::Borrowed(text))
            }
            (Encoding::Utf8, Err(_)) => Err(BillError::new(
                line,
                "not valid UTF-8, although the lines before it were UTF-8",
            )),
            (Encoding::Undecided | Encoding::Gbk, _) => {
                self.encoding = Encoding::Gbk;
                GBK.decode_without_bom_handling_and_without_replacement(bytes)
                    .ok_or_else(|| BillError::new(line, "neither UTF-8 nor GBK text"))
            }
        }
    }
}

/// A column found in a header: its name (for messages) and position.
pub(super) struct Col {
    pub(super) name: &'static str,
    pub(super) idx: usize,
}

/// A header line: the cleaned column names.
pub(super) struct Header {
    names: Vec<String>,
    line: usize,
}

impl Header {
    /// Splits a header line. Names are trimmed (and a stray backtick dropped); half-width
    /// parentheses are read as the full-width ones Alipay uses, so `订单金额(元)` still matches.
    pub(super) fn parse(text: &str, line: usize) -> Self {
        let names = split_cells(text)
            .iter()
            .map(|cell| clean(cell).replace('(', "（").replace(')', "）"))
            .collect();
        Header { names, line }
    }

    pub(super) fn width(&self) -> usize {
        self.names.len()
    }

    /// The column called `name`; its first occurrence if the header repeats it.
    pub(super) fn col(&self, name: &'static str) -> Result<Col, BillError> {
        self.find(name)
            .ok_or_else(|| BillError::new(self.line, format!("missing column {name}")))
    }

    /// The column called `name`, if the header has it.
    pub(super) fn find(&self, name: &'static str) -> Option<Col> {
        self.names.iter().position(|n| n == name).map(|idx| Col { name, idx })
    }

    /// The first of `names` (one column under the names different versions gave it) that the
    /// header has.
    pub(super) fn find_of(&self, names: &[&'static str]) -> Option<Col> {
        names.iter().find_map(|name| self.find(name))
    }

    /// As [`Header::find_of`]; missing, the error names the first name and the others.
    pub(super) fn col_of(&self, names: &[&'static str]) -> Result<Col, BillError> {
        self.find_of(names).ok_or_else(|| {
            let others = names[1..].join(" or ");
            let or = if others.is_empty() {
                String::new()
            } else {
                format!(" (or {others})")
            };
            BillError::new(self.line, format!("missing column {}{or}", names[0]))
        })
    }
}

/// Splits a line into cells, which must be exactly `width` (see "Cell counts" in the module
/// documentation).
pub(super) fn cells_for(text: &str, width: usize, line: usize) -> Result<Vec<Cow<'_, str>>, BillError> {
    let cells = split_cells(text);
    let hint = if cells.len() > width {
        " (an unquoted comma in a cell?)"
    } else {
        ""
    };
    if cells.len() != width {
        return Err(BillError::new(
            line,
            format!("the row has {} cells, the header has {width}{hint}", cells.len()),
        ));
    }
    Ok(cells)
}

/// Splits one CSV line into cells on commas, with csv-core's reader (the `csv` crate's own
/// parser), one field at a time. A cell that starts with a double quote runs to the closing
/// quote, may contain commas, and reads `""` as one quote; the reader is lenient as providers do
/// not quote in practice: text between a closing quote and the next comma is kept, and an
/// unclosed quote runs to the end of the line. WeChat prefixes every cell with a backtick: a
/// cell that starts with a backtick and a double quote (in case WeChat quotes after its prefix)
/// is the quoted cell after the backtick, which is why the fields are read one by one. A quote
/// anywhere else, a lone CR and a BOM are text. An empty line is one empty cell.
pub(super) fn split_cells(line: &str) -> Vec<Cow<'_, str>> {
    if line.is_empty() {
        return vec![Cow::Borrowed("")];
    }
    LINE_READER.with_borrow_mut(|(csv, unquoted)| {
        csv.reset();
        // An empty line before the record: skipped, and the start of the input is behind, where
        // csv-core would drop a UTF-8 BOM (the line reader drops the one of line 1; any other is
        // text).
        let _ = csv.read_field(b"\n", &mut [0u8; 1]);
        unquoted.clear();
        unquoted.resize(line.len(), 0);
        let mut cells = Vec::new();
        let mut at = 0;
        loop {
            if line[at..].starts_with("`\"") {
                at += 1;
            }
            let quoted = line[at..].starts_with('"');
            let (mut result, read, mut written) = csv.read_field(&line.as_bytes()[at..], unquoted);
            if result == ReadFieldResult::InputEmpty {
                // The line is the whole record: its end ends the last field.
                let (end, _, more) = csv.read_field(&[], &mut unquoted[written..]);
                (result, written) = (end, written + more);
            }
            // An unquoted cell is the line's own text (the reader copied it as it is); a quoted
            // one is what the reader made of it, which splits only at the ASCII quotes it drops.
            cells.push(if quoted {
                Cow::Owned(String::from_utf8_lossy(&unquoted[..written]).into_owned())
            } else {
                Cow::Borrowed(&line[at..at + written])
            });
            at += read;
            if result != (ReadFieldResult::Field { record_end: false }) {
                return cells;
            }
        }
    })
}

thread_local! {
    /// csv-core's reader of one line and its output buffer, reused: only LF ends a record (the
    /// line reader removed it and the CR before it, so a lone CR inside a line is text).
    static LINE_READER: RefCell<(csv_core::Reader, Vec<u8>)> = RefCell::new((
        csv_core::ReaderBuilder::new().terminator(csv_core::Terminator::Any(b'\n')).build(),
        Vec::new(),
    ));
}

/// A cell's value: surrounding whitespace (including Alipay's trailing tabs) and WeChat's
/// leading backtick removed.
pub(super) fn clean(cell: &str) -> &str {
    let cell = cell.trim();
    cell.strip_prefix('`').unwrap_or(cell).trim()
}

/// An amount cell in cents; empty counts as zero.
pub(super) fn amount(value: &str, column: &str, line: usize) -> Result<i64, BillError> {
    if value.is_empty() {
        return Ok(0);
    }
    parse_yuan(value).ok_or_else(|| BillError::new(line, format!("{column} \"{value}\" is not an amount")))
}

/// A timestamp cell; empty is `None`.
pub(super) fn time(value: &str, column: &str, line: usize) -> Result<Option<NaiveDateTime>, BillError> {
    if value.is_empty() {
        return Ok(None);
    }
    fixed_width_time(value)
        .ok_or(())
        .or_else(|()| NaiveDateTime::parse_from_str(value, TIME_FORMAT))
        .or_else(|_| NaiveDateTime::parse_from_str(value, TIME_FORMAT_SLASHES))
        .map(Some)
        .map_err(|_| BillError::new(line, format!("{column} \"{value}\" is not a time")))
}

/// Reads the usual `YYYY-MM-DD HH:MM:SS` (or `YYYY/MM/DD HH:MM:SS`) by hand: chrono interprets its
/// format string on every call, which made time parsing the costliest step per row in debug
/// builds. Anything else (or an invalid date) is `None` and goes to chrono.
pub(super) fn fixed_width_time(value: &str) -> Option<NaiveDateTime> {
    let b = value.as_bytes();
    let shape = b.len() == 19 && b[10] == b' ' && b[13] == b':' && b[16] == b':';
    if !shape || !matches!((b[4], b[7]), (b'-', b'-') | (b'/', b'/')) {
        return None;
    }
    let number = |from: usize, to: usize| {
        b[from..to]
            .iter()
            .try_fold(0u32, |n, &d| d.is_ascii_digit().then(|| n * 10 + u32::from(d - b'0')))
    };
    let year = i32::try_from(number(0, 4)?).ok()?;
    NaiveDate::from_ymd_opt(year, number(5, 7)?, number(8, 10)?)?.and_hms_opt(
        number(11, 13)?,
        number(14, 16)?,
        number(17, 19)?,
    )
}

/// Adds to a running total, refusing to overflow.
pub(super) fn add_cents(total: &mut i64, cents: i64, line: usize) -> Result<(), BillError> {
    *total = total
        .checked_add(cents)
        .ok_or_else(|| BillError::new(line, "the amounts overflow"))?;
    Ok(())
}

/// Compares a summary amount with the rows' total.
pub(super) fn check_total(line: usize, what: &str, said: i64, rows: i64) -> Result<(), BillError> {
    if said == rows {
        return Ok(());
    }
    Err(BillError::new(
        line,
        format!(
            "the summary says {what} {}, the rows add up to {}",
            format_yuan(said),
            format_yuan(rows)
        ),
    ))
}

/// Counts a row into the summary, then hands it to the caller's callback.
pub(super) fn deliver(
    summary: &mut BillSummary,
    row: BillRow,
    callback: &mut impl FnMut(BillRow) -> Result<(), String>,
) -> Result<(), BillError> {
    let line = row.line;
    summary.rows += 1;
    match row.kind {
        BillKind::Payment => {
            summary.payments += 1;
            add_cents(&mut summary.payment_cents, row.amount_cents, line)?;
        }
        BillKind::Refund => {
            summary.refunds += 1;
            add_cents(&mut summary.refund_cents, row.amount_cents, line)?;
        }
        BillKind::Other => {}
    }
    callback(row).map_err(|why| BillError::new(line, why))
}
