//! Unpacking the bills as the providers' download URLs deliver them, for the fetcher to call:
//! the WeChat Pay trade bill as gzip (`tar_type=GZIP`) or plain, checked against the SHA1 that
//! the apply-bill response gives for the *unpacked* bill (`hash_type: SHA1`, `hash_value`), and
//! the Alipay `….csv.zip`, whose `…_业务明细.csv` entry (names in GBK) is the bill, the
//! `…_业务明细(汇总).csv` beside it being ignored.
//!
//! Everything streams through a fixed buffer: memory does not grow with the bill. The bill is
//! written to a temporary file next to `dest` and renamed onto `dest` only once it is complete
//! (and, for WeChat, its SHA1 matches), so a broken download never takes the place of a bill,
//! and a reader of `dest` never sees half a file. At most [`MAX_UNPACKED_BYTES`] are written,
//! so a decompression bomb cannot fill the disk.

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

use sha1::{Digest, Sha1};

/// The largest unpacked bill accepted (4 GiB; a million-row bill is about 400 MB).
pub const MAX_UNPACKED_BYTES: u64 = 4 << 30;

/// The ending of the Alipay zip entry that holds the bill.
const ALIPAY_DETAIL_SUFFIX: &str = "_业务明细.csv";

/// A bill written to its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unpacked {
    pub path: PathBuf,
    /// Size of the unpacked bill.
    pub bytes: u64,
    /// SHA1 of the unpacked bill, lowercase hex.
    pub sha1: String,
    /// The zip entry the bill came from, decoded (Alipay only).
    pub entry: Option<String>,
}

/// Why a downloaded bill was not put in place. Nothing is left at `dest` (nor a temporary file).
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("reading or writing the bill: {0}")]
    Io(#[from] io::Error),
    #[error("the bill's SHA1 is {actual}, the provider said {expected}")]
    Sha1Mismatch { expected: String, actual: String },
    #[error("the unpacked bill is larger than {MAX_UNPACKED_BYTES} bytes")]
    TooLarge,
    #[error("not a readable zip: {0}")]
    BadZip(String),
    #[error("the zip has no …{ALIPAY_DETAIL_SUFFIX} entry (it has: {0})")]
    NoDetailEntry(String),
    #[error("the zip has several …{ALIPAY_DETAIL_SUFFIX} entries: {0}")]
    SeveralDetailEntries(String),
}

/// Gunzips a WeChat Pay bill downloaded with `tar_type=GZIP` from `gz` into `dest`, checking the
/// SHA1 of the unpacked bytes against `expected_sha1` (hex, any case).
pub fn unpack_wechat_gz<R: Read>(gz: R, dest: &Path, expected_sha1: &str) -> Result<Unpacked, ArchiveError> {
    save_wechat_bill(flate2::read::GzDecoder::new(gz), dest, expected_sha1)
}

/// Writes a WeChat Pay bill downloaded without `tar_type` (plain text) from `bill` into `dest`,
/// checking its SHA1 against `expected_sha1` (hex, any case).
pub fn save_wechat_bill<R: Read>(bill: R, dest: &Path, expected_sha1: &str) -> Result<Unpacked, ArchiveError> {
    let expected = expected_sha1.trim().to_ascii_lowercase();
    write_in_place(bill, dest, None, |sha1| {
        if sha1 == expected {
            Ok(())
        } else {
            Err(ArchiveError::Sha1Mismatch {
                expected: expected.clone(),
                actual: sha1.to_string(),
            })
        }
    })
}

/// Writes the `…_业务明细.csv` entry of an Alipay bill zip into `dest`, as it is (GBK: the
/// parser reads it). Entry names are read as UTF-8 when they are valid UTF-8 and as GBK
/// otherwise, as Alipay writes them. A zip is read from its end, so `zip` must seek: the fetcher
/// downloads it to a temporary file (or memory) first.
pub fn unpack_alipay_zip<R: Read + Seek>(zip: R, dest: &Path) -> Result<Unpacked, ArchiveError> {
    let mut archive = zip::ZipArchive::new(zip).map_err(|e| ArchiveError::BadZip(e.to_string()))?;
    let mut names = Vec::with_capacity(archive.len());
    let mut detail = vec![];
    for i in 0..archive.len() {
        let entry = archive
            .by_index_raw(i)
            .map_err(|e| ArchiveError::BadZip(e.to_string()))?;
        let name = entry_name(entry.name_raw());
        if file_name(&name).ends_with(ALIPAY_DETAIL_SUFFIX) {
            detail.push(i);
        }
        names.push(name);
    }
    let index = match detail[..] {
        [i] => i,
        [] => return Err(ArchiveError::NoDetailEntry(names.join(", "))),
        _ => {
            let several: Vec<&str> = detail.iter().map(|&i| names[i].as_str()).collect();
            return Err(ArchiveError::SeveralDetailEntries(several.join(", ")));
        }
    };
    let entry = archive
        .by_index(index)
        .map_err(|e| ArchiveError::BadZip(e.to_string()))?;
    write_in_place(entry, dest, Some(names.swap_remove(index)), |_| Ok(()))
}

/// A zip entry's name: UTF-8 if it is valid UTF-8, else GBK (undecodable bytes replaced).
fn entry_name(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(name) => name.to_string(),
        Err(_) => encoding_rs::GBK.decode_without_bom_handling(raw).0.into_owned(),
    }
}

/// The last component of a zip entry name (`dir/name` or `dir\name`).
fn file_name(name: &str) -> &str {
    name.rsplit(['/', '\\']).next().unwrap_or(name)
}

/// Streams `from` into a temporary file beside `dest`, hashing it; when `check` accepts the
/// SHA1, syncs the file and renames it onto `dest`. On any error the temporary file is removed.
fn write_in_place<R: Read>(
    mut from: R,
    dest: &Path,
    entry: Option<String>,
    check: impl FnOnce(&str) -> Result<(), ArchiveError>,
) -> Result<Unpacked, ArchiveError> {
    let dir = match dest.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Unique per process and call, so two downloads of one bill never share a temporary file.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}-{call}.part", std::process::id()));
    let result = (|| {
        let mut out = BufWriter::with_capacity(256 * 1024, File::create(&tmp)?);
        let mut hash = Sha1::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut bytes = 0u64;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ArchiveError::Io(e)),
            };
            bytes += n as u64;
            if bytes > MAX_UNPACKED_BYTES {
                return Err(ArchiveError::TooLarge);
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n])?;
        }
        let sha1 = hex::encode(hash.finalize());
        check(&sha1)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, dest)?;
        Ok(Unpacked {
            path: dest.to_path_buf(),
            bytes,
            sha1,
            entry,
        })
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bills::{parse_alipay, parse_wechat, BillSummary};

    fn samples() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/provider-samples")
    }

    fn tempdir() -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "fitorder-archive-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Only `dest` is in the directory: no temporary file is left behind.
    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// SHA1 of the unpacked v3 ALL bill, as SOURCES.md records it (computed with `sha1sum` on
    /// the .csv the .gz gunzips to byte for byte).
    const ALL_SHA1: &str = "b18b51eb64422040e5ad738d47b358a40b1a7997";

    #[test]
    fn the_wechat_gz_sample_unpacks_checks_its_sha1_and_parses() {
        let dir = tempdir();
        let dest = dir.join("wechatpay-2021-01-28.csv");
        let gz = File::open(samples().join("wechat/bill/v3_tradebill_ALL_20210128.csv.gz")).unwrap();
        let done = unpack_wechat_gz(gz, &dest, &ALL_SHA1.to_uppercase()).unwrap();
        assert_eq!(done.sha1, ALL_SHA1);
        assert_eq!(done.entry, None);
        let plain = std::fs::read(samples().join("wechat/bill/v3_tradebill_ALL_20210128.csv")).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), plain);
        assert_eq!(done.bytes, plain.len() as u64);
        assert_eq!(listing(&dir), ["wechatpay-2021-01-28.csv"]);
        let summary = parse_wechat(io::BufReader::new(File::open(&dest).unwrap()), |_| Ok(())).unwrap();
        assert_eq!((summary.rows, summary.payment_cents), (3, 3));
        // The same bill downloaded plain.
        let dest2 = dir.join("plain.csv");
        save_wechat_bill(&plain[..], &dest2, ALL_SHA1).unwrap();
        assert_eq!(std::fs::read(&dest2).unwrap(), plain);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_wrong_sha1_or_a_broken_gz_leaves_nothing() {
        let dir = tempdir();
        let dest = dir.join("wechatpay-2021-01-28.csv");
        std::fs::write(&dest, "the bill that was there").unwrap();
        let gz = std::fs::read(samples().join("wechat/bill/v3_tradebill_ALL_20210128.csv.gz")).unwrap();
        // The apply-bill sample's hash_value belongs to no bill (SOURCES.md): it must be refused.
        let e = unpack_wechat_gz(&gz[..], &dest, "dcd7ceb3d382a1181798368bb15d8437de46c00f").unwrap_err();
        assert!(
            matches!(&e, ArchiveError::Sha1Mismatch { actual, .. } if actual == ALL_SHA1),
            "{e}"
        );
        // Cut short: the gzip trailer (CRC, size) is missing.
        let e = unpack_wechat_gz(&gz[..gz.len() - 8], &dest, ALL_SHA1).unwrap_err();
        assert!(matches!(e, ArchiveError::Io(_)), "{e}");
        // One flipped byte in the compressed data.
        let mut flipped = gz.clone();
        flipped[40] ^= 0x55;
        assert!(unpack_wechat_gz(&flipped[..], &dest, ALL_SHA1).is_err());
        assert_eq!(std::fs::read_to_string(&dest).unwrap(), "the bill that was there");
        assert_eq!(listing(&dir), ["wechatpay-2021-01-28.csv"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bill_larger_than_any_buffer_unpacks_with_the_sha1_of_its_bytes() {
        // 64 MiB of zeros compress to ~64 KiB: many times through the 64 KiB buffer; the SHA1 is
        // that of the unpacked bytes, computed here apart.
        struct Zeros(u64);
        impl Read for Zeros {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = (buf.len() as u64).min(self.0) as usize;
                buf[..n].fill(0);
                self.0 -= n as u64;
                Ok(n)
            }
        }
        let size = 64u64 << 20;
        let mut gz = flate2::read::GzEncoder::new(Zeros(size), flate2::Compression::fast());
        let mut packed = Vec::new();
        gz.read_to_end(&mut packed).unwrap();
        let mut expected = Sha1::new();
        io::copy(&mut Zeros(size), &mut expected).unwrap();
        let expected = hex::encode(expected.finalize());
        let dir = tempdir();
        let done = unpack_wechat_gz(&packed[..], &dir.join("big.csv"), &expected).unwrap();
        assert_eq!((done.bytes, done.sha1), (size, expected));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A zip file written by hand from the format (APPNOTE.TXT §4.3: local headers, central
    /// directory, end record), not with the zip crate, so the names are raw bytes with the
    /// UTF-8 flag unset — as Alipay's GBK names are. `deflate` chooses method 8 over 0.
    fn zip_by_hand(entries: &[(&[u8], &[u8])], deflate: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data) in entries {
            let mut crc = flate2::Crc::new();
            crc.update(data);
            let packed = if deflate {
                let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(data).unwrap();
                e.finish().unwrap()
            } else {
                data.to_vec()
            };
            let method: u16 = if deflate { 8 } else { 0 };
            let offset = out.len() as u32;
            let common = |v: &mut Vec<u8>| {
                v.extend_from_slice(&20u16.to_le_bytes()); // version needed
                v.extend_from_slice(&0u16.to_le_bytes()); // flags: no UTF-8 bit (11)
                v.extend_from_slice(&method.to_le_bytes());
                v.extend_from_slice(&0u16.to_le_bytes()); // time
                v.extend_from_slice(&0x5130u16.to_le_bytes()); // date 2020-09-16
                v.extend_from_slice(&crc.sum().to_le_bytes());
                v.extend_from_slice(&(packed.len() as u32).to_le_bytes());
                v.extend_from_slice(&(data.len() as u32).to_le_bytes());
                v.extend_from_slice(&(name.len() as u16).to_le_bytes());
                v.extend_from_slice(&0u16.to_le_bytes()); // extra length
            };
            out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
            common(&mut out);
            out.extend_from_slice(name);
            out.extend_from_slice(&packed);
            central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
            central.extend_from_slice(&20u16.to_le_bytes()); // version made by
            common(&mut central);
            central.extend_from_slice(&[0; 6]); // comment length, disk, internal attributes
            central.extend_from_slice(&0u32.to_le_bytes()); // external attributes
            central.extend_from_slice(&offset.to_le_bytes());
            central.extend_from_slice(name);
        }
        let (cd_offset, cd_len) = (out.len() as u32, central.len() as u32);
        out.extend_from_slice(&central);
        out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
        out.extend_from_slice(&[0; 4]); // disk numbers
        out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
        out.extend_from_slice(&cd_len.to_le_bytes());
        out.extend_from_slice(&cd_offset.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out
    }

    fn gbk(text: &str) -> Vec<u8> {
        let (bytes, _, unmappable) = encoding_rs::GBK.encode(text);
        assert!(!unmappable);
        bytes.into_owned()
    }

    #[test]
    fn the_alipay_zip_yields_its_detail_entry_chosen_by_gbk_name() {
        let sample = std::fs::read_to_string(
            samples().join("alipay/bill/unattributed/20880211096256330156_20190916_业务明细.utf8-rendered.csv"),
        )
        .unwrap();
        // As Alipay ships it: GBK content, CRLF, GBK names, the 汇总 file first.
        let bill = gbk(&sample.replace('\n', "\r\n"));
        let totals = gbk("#支付宝业务汇总查询\r\n门店编号,门店名称,交易订单总笔数\r\n");
        let detail_name = gbk("20880211096256330156_20190916_业务明细.csv");
        assert!(std::str::from_utf8(&detail_name).is_err(), "GBK, not UTF-8");
        for deflate in [true, false] {
            let zip = zip_by_hand(
                &[
                    (&gbk("20880211096256330156_20190916_业务明细(汇总).csv"), &totals),
                    (&detail_name, &bill),
                ],
                deflate,
            );
            let dir = tempdir();
            let dest = dir.join("alipay-2019-09-16.csv");
            let done = unpack_alipay_zip(io::Cursor::new(&zip), &dest).unwrap();
            assert_eq!(
                done.entry.as_deref(),
                Some("20880211096256330156_20190916_业务明细.csv")
            );
            assert_eq!(std::fs::read(&dest).unwrap(), bill, "deflate {deflate}");
            assert_eq!(listing(&dir), ["alipay-2019-09-16.csv"]);
            let summary = parse_alipay(io::BufReader::new(File::open(&dest).unwrap()), |_| Ok(())).unwrap();
            assert_eq!(
                summary,
                BillSummary {
                    rows: 10,
                    payments: 6,
                    refunds: 4,
                    payment_cents: 6,
                    refund_cents: 4
                }
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn an_alipay_zip_without_exactly_one_detail_entry_is_refused() {
        let dir = tempdir();
        let dest = dir.join("alipay.csv");
        let only_totals = zip_by_hand(&[(&gbk("2088_20190916_业务明细(汇总).csv"), b"x")], true);
        let e = unpack_alipay_zip(io::Cursor::new(&only_totals), &dest).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the zip has no …_业务明细.csv entry (it has: 2088_20190916_业务明细(汇总).csv)"
        );
        let two = zip_by_hand(
            &[(&gbk("a_业务明细.csv"), b"x"), (&gbk("dir/b_业务明细.csv"), b"y")],
            false,
        );
        let e = unpack_alipay_zip(io::Cursor::new(&two), &dest).unwrap_err();
        assert!(matches!(e, ArchiveError::SeveralDetailEntries(_)), "{e}");
        let e = unpack_alipay_zip(io::Cursor::new(b"PK not a zip"), &dest).unwrap_err();
        assert!(matches!(e, ArchiveError::BadZip(_)), "{e}");
        // A damaged entry (CRC mismatch) is refused after streaming it, and leaves nothing.
        let mut bad = zip_by_hand(&[(&gbk("a_业务明细.csv"), b"some bill text")], false);
        let at = bad.windows(4).position(|w| w == b"some").unwrap();
        bad[at] = b'S';
        let e = unpack_alipay_zip(io::Cursor::new(&bad), &dest).unwrap_err();
        assert!(matches!(e, ArchiveError::Io(_)), "{e}");
        assert!(listing(&dir).is_empty(), "{:?}", listing(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
