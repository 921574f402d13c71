//! Headless Chromium for the HTML report tests (trace.html, diverge.html): find the binary
//! (a skip line without it, a failure under RLX_REQUIRE_CHROMIUM=1), its command line, and a
//! PNG decoder for its screenshots.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `/usr/bin/chromium`, or `None` with a skip line on stderr (panics instead under
/// `RLX_REQUIRE_CHROMIUM=1`).
pub fn chromium() -> Option<PathBuf> {
    let p = PathBuf::from("/usr/bin/chromium");
    if p.is_file() {
        return Some(p);
    }
    if rlx_ir::env::get("RLX_REQUIRE_CHROMIUM").is_some_and(|v| v == "1") {
        panic!(
            "RLX_REQUIRE_CHROMIUM=1 but /usr/bin/chromium is missing (apt-get install chromium)"
        );
    }
    {
        use std::io::Write; // past the test harness's capture: the skip shows in CI logs
        let _ = writeln!(
            std::io::stderr(),
            "skipping {}: /usr/bin/chromium not installed",
            std::thread::current().name().unwrap_or("?")
        );
    }
    None
}

pub fn chromium_cmd(bin: &Path, profile: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1200,800",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// Decode an 8-bit RGB/RGBA non-interlaced PNG (what Chromium writes) into RGB pixels.
pub fn decode_png(bytes: &[u8]) -> (usize, usize, Vec<[u8; 3]>) {
    use std::io::Read;
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let (mut w, mut h, mut ch) = (0usize, 0usize, 0usize);
    let mut idat = vec![];
    let mut p = 8;
    while p + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
        let kind = &bytes[p + 4..p + 8];
        let body = &bytes[p + 8..p + 8 + len];
        match kind {
            b"IHDR" => {
                w = u32::from_be_bytes(body[0..4].try_into().unwrap()) as usize;
                h = u32::from_be_bytes(body[4..8].try_into().unwrap()) as usize;
                assert_eq!(body[8], 8, "bit depth");
                ch = match body[9] {
                    2 => 3,
                    6 => 4,
                    t => panic!("PNG color type {t}"),
                };
                assert_eq!(body[12], 0, "interlaced");
            }
            b"IDAT" => idat.extend_from_slice(body),
            _ => {}
        }
        p += 12 + len;
    }
    let mut raw = vec![];
    flate2::read::ZlibDecoder::new(&idat[..])
        .read_to_end(&mut raw)
        .unwrap();
    let stride = w * ch;
    let mut prev = vec![0u8; stride];
    let mut px = Vec::with_capacity(w * h);
    for y in 0..h {
        let row = &raw[y * (stride + 1)..(y + 1) * (stride + 1)];
        let f = row[0];
        let mut cur = row[1..].to_vec();
        for i in 0..stride {
            let a = if i >= ch { cur[i - ch] as i32 } else { 0 };
            let b = prev[i] as i32;
            let c = if i >= ch { prev[i - ch] as i32 } else { 0 };
            let add = match f {
                0 => 0,
                1 => a,
                2 => b,
                3 => (a + b) / 2,
                4 => {
                    let pp = a + b - c;
                    let (pa, pb, pc) = ((pp - a).abs(), (pp - b).abs(), (pp - c).abs());
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                _ => panic!("PNG filter {f}"),
            };
            cur[i] = (cur[i] as i32 + add) as u8;
        }
        for x in 0..w {
            px.push([cur[x * ch], cur[x * ch + 1], cur[x * ch + 2]]);
        }
        prev = cur;
    }
    (w, h, px)
}

/// Screenshot `url` at 1200x800 into `png` with a fresh `profile`; asserts the file was
/// written (naming Chromium's stderr otherwise) and returns it decoded.
pub fn screenshot(
    bin: &Path,
    profile: &Path,
    url: &str,
    png: &Path,
) -> (usize, usize, Vec<[u8; 3]>) {
    let o = chromium_cmd(bin, profile)
        .arg(format!("--screenshot={}", png.display()))
        .arg(url)
        .output()
        .unwrap();
    assert!(
        png.is_file(),
        "no screenshot: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    decode_png(&std::fs::read(png).unwrap())
}

/// The page's DOM after Chromium rendered it (scripts run).
pub fn dump_dom(bin: &Path, profile: &Path, url: &str) -> String {
    let o = chromium_cmd(bin, profile)
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Pixels that are not (near) white: a blank page has almost none.
pub fn nonwhite(px: &[[u8; 3]]) -> usize {
    px.iter().filter(|p| p.iter().any(|&c| c < 235)).count()
}

/// Pixels of the reports' highlight red (#dc2626 and its antialiased neighbours).
pub fn red(px: &[[u8; 3]]) -> usize {
    px.iter()
        .filter(|p| p[0] > 200 && p[1] < 70 && p[2] < 70)
        .count()
}
