//! The status page in a real browser: a controller, an echo server registered with it and a
//! load generator calling the server through the registry run as `volley` processes, and
//! headless Chromium opens their status pages in an 800 px wide window. Each page's header must
//! name its process (role, listen address, version, uptime), the controller's page must list
//! the registered service, and the server's page must show its method's call rate above zero,
//! changing between two reads — values the page's script filled in from `/vars.json`. Neither
//! page may be wider than the window (no sideways scrolling). A screenshot of each page at
//! 800 px is saved as the run's artifact (the paths are printed).
//!
//! Chromium is driven by its own command-line flags (`--headless --dump-dom` after a
//! `--virtual-time-budget`, `--screenshot`), so the test needs no browser-automation crate.
//! The test is ignored by default because it needs Chromium; `scripts/test` installs it
//! (Debian's `chromium`) and runs it, and on CI (`CI=true`) a run that leaves it out fails.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// The service the echo server registers (its method is `echo`).
#[path = "../../volley/tests/support/wait.rs"]
mod wait;
use wait::try_poll_blocking;

const SERVICE: &str = "status-page-echo";

fn volley() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_volley"));
    // Settings from the environment would change what is tested.
    for var in ["VOLLEY_TOKEN", "VOLLEY_REGISTRY_TOKEN", "VOLLEY_REGISTRATION_CREDENTIAL"] {
        c.env_remove(var);
    }
    c
}

/// A running process: killed when dropped, so a failed assertion leaves nothing behind. Its
/// output lines (stdout and stderr) arrive on `lines`.
struct Process {
    child: std::process::Child,
    lines: Receiver<String>,
    /// Every line read so far, for failure messages.
    seen: Vec<String>,
}

impl Process {
    fn start(args: &[&str]) -> Process {
        let mut child = volley().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let (tx, lines) = channel();
        let out: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [out, err] {
            let tx = tx.clone();
            // Read to the end, so the process never meets a closed pipe.
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        Process { child, lines, seen: Vec::new() }
    }

    /// The first line for which `pick` gives a value (read already, or within `within`).
    /// stdout and stderr are read apart, so their lines may come in either order.
    fn wait_for<T>(&mut self, within: Duration, what: &str, pick: impl Fn(&str) -> Option<T>) -> T {
        if let Some(v) = self.seen.iter().find_map(|l| pick(l)) {
            return v;
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = pick(&line);
                    self.seen.push(line);
                    if let Some(v) = found {
                        return v;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {what} within {within:?}; output: {:?}", self.seen)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait();
                    panic!("the process ended ({status:?}) before printing {what}; output: {:?}", self.seen)
                }
            }
        }
    }

    /// The admin endpoint's address, from the line `admin endpoint on http://ADDR/ ...`.
    fn admin_address(&mut self) -> String {
        self.wait_for(Duration::from_secs(60), "the admin endpoint's address", |l| {
            let rest = l.strip_prefix("admin endpoint on http://")?;
            Some(rest.split('/').next()?.to_string())
        })
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the browser is: `VOLLEY_CHROMIUM` if set, else `chromium` or `chromium-browser` on
/// `path` (the `PATH` variable). The error says how to get one.
fn locate_chromium(explicit: Option<PathBuf>, path: Option<std::ffi::OsString>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "VOLLEY_CHROMIUM is {}, which is not a file: point it at a Chromium binary",
                p.display()
            ))
        };
    }
    let dirs: Vec<PathBuf> = path.iter().flat_map(std::env::split_paths).collect();
    ["chromium", "chromium-browser"]
        .iter()
        .flat_map(|name| dirs.iter().map(move |d| d.join(name)))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "this test needs Chromium, and there is no chromium on PATH: run scripts/test, which \
             installs it (apt-get install chromium) and runs every test; or set VOLLEY_CHROMIUM"
                .to_string()
        })
}

/// Headless Chromium, one run per page read (each with a profile of its own).
struct Browser {
    bin: PathBuf,
}

/// Virtual time the page gets before it is read: its script polls `/vars.json` at once and
/// then every second, so three seconds is several refreshes. (Virtual time waits for the
/// fetches, so a slow machine does not shorten it.)
const PAGE_TIME_MS: u32 = 3000;

/// The browser window: the page must fit its width (a laptop's half screen, a narrow tab).
const WINDOW_WIDTH: u32 = 800;
const WINDOW_HEIGHT: u32 = 1400;

/// Longest a single browser run may take before it counts as hung.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(120);

impl Browser {
    fn run(&self, url: &str, action: &str) -> String {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(&self.bin)
            // --no-sandbox: Chromium refuses to run as root with its sandbox (CI containers run
            // as root), and the page is our own, on the loopback interface.
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
            ])
            .args(["--lang=en-US", "--hide-scrollbars"])
            .arg(format!("--window-size={WINDOW_WIDTH},{WINDOW_HEIGHT}"))
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--virtual-time-budget={PAGE_TIME_MS}"))
            .arg(action)
            .arg(url)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let Some(status) = try_poll_blocking(BROWSER_TIMEOUT, || child.try_wait().unwrap()) else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium {action} {url} did not finish within {BROWSER_TIMEOUT:?}");
        };
        let (out, err) = (out.join().unwrap(), err.join().unwrap());
        assert!(status.success(), "chromium {action} {url}: {status}; stderr: {err}");
        out
    }

    /// The page's DOM after its script ran for [`PAGE_TIME_MS`].
    fn dom(&self, url: &str) -> String {
        self.run(url, "--dump-dom")
    }

    fn screenshot(&self, url: &str, to: &Path) {
        let _ = std::fs::remove_file(to);
        self.run(url, &format!("--screenshot={}", to.display()));
        let png = std::fs::read(to).unwrap_or_else(|e| panic!("no screenshot at {}: {e}", to.display()));
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{} is not a PNG", to.display());
        println!("screenshot of {url}: {}", to.display());
    }

    /// Reads `url` until `pick` finds what it looks for in the DOM, for up to `within`.
    fn poll<T>(&self, url: &str, within: Duration, what: &str, pick: impl Fn(&str) -> Option<T>) -> T {
        let mut dom = String::new();
        try_poll_blocking(within, || {
            dom = self.dom(url);
            pick(&dom)
        })
        .unwrap_or_else(|| panic!("no {what} on {url} within {within:?}; last DOM:\n{dom}"))
    }
}

/// The text of the cell `col` (its `data-col`) in the row of the server method `method`.
fn method_cell<'a>(dom: &'a str, method: &str, col: &str) -> Option<&'a str> {
    let row_start = dom.find(&format!("data-side=\"server\" data-method=\"{method}\""))?;
    let row = &dom[row_start..];
    let row = &row[..row.find("</tr>")?];
    let cell = &row[row.find(&format!("data-col=\"{col}\""))?..];
    let text = &cell[cell.find('>')? + 1..];
    Some(&text[..text.find('<')?])
}

/// The text of the element with the id `id` (up to its first child element).
fn element_text<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let text = &dom[at..];
    let text = &text[text.find('>')? + 1..];
    Some(&text[..text.find('<')?])
}

/// The header's role, listen addresses, version and uptime, once the script filled them in.
fn header(dom: &str) -> Option<[&str; 4]> {
    let fields = ["role", "addresses", "version", "uptime"].map(|id| element_text(dom, id));
    let [Some(role), Some(addresses), Some(version), Some(uptime)] = fields else { return None };
    uptime.starts_with("up ").then_some([role, addresses, version, uptime])
}

/// The page's width and the window's (`data-scroll-width`, `data-client-width` on the root
/// element, which the page's script notes after each refresh).
fn widths(dom: &str) -> Option<(u32, u32)> {
    let attr = |name: &str| -> Option<u32> {
        let at = dom.find(&format!("{name}=\""))? + name.len() + 2;
        dom[at..].split('"').next()?.parse().ok()
    };
    Some((attr("data-scroll-width")?, attr("data-client-width")?))
}

/// Checks that the page's header names the process (`role`, an address containing `address`,
/// this build's version, an uptime) and that the page fits the window's width.
fn check_header_and_width(browser: &Browser, page: &str, role: &str, address: &str) {
    let dom = browser.poll(page, Duration::from_secs(60), "the header filled in", |dom| {
        header(dom).is_some().then(|| dom.to_string())
    });
    let [shown_role, addresses, version, uptime] = header(&dom).unwrap();
    assert_eq!(shown_role, role, "{page}");
    assert!(addresses.contains(address), "{page}: header addresses {addresses:?}, expected {address}");
    assert_eq!(version, format!("volley {}", env!("CARGO_PKG_VERSION")), "{page}");
    println!("{page}: header {role} · {addresses} · {version} · {uptime}");
    let (page_width, window_width) =
        widths(&dom).unwrap_or_else(|| panic!("{page}: no widths noted:\n{dom}"));
    assert!(
        window_width <= WINDOW_WIDTH && window_width > WINDOW_WIDTH / 2,
        "{page}: the window is {window_width} px wide, asked for {WINDOW_WIDTH}"
    );
    assert!(
        page_width <= window_width,
        "{page} is {page_width} px wide in a {window_width} px window: it scrolls sideways"
    );
}

/// A number as the page writes it (`1,234.5`), or `None` for `–` (nothing measured yet).
fn number(text: &str) -> Option<f64> {
    let digits: String = text.chars().filter(|c| c.is_ascii_digit() || *c == '.').collect();
    digits.parse().ok()
}

/// The echo method's recent call rate and total calls on a server's page, once both are shown.
fn rate_and_calls(dom: &str) -> Option<(f64, f64)> {
    let method = format!("{SERVICE}/echo");
    let rate = number(method_cell(dom, &method, "calls_per_s")?)?;
    let calls = number(method_cell(dom, &method, "calls")?)?;
    Some((rate, calls))
}

/// Where the screenshots go: `target/artifacts/` (CI keeps that directory).
fn artifacts() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("CARGO_TARGET_TMPDIR is target/tmp");
    let dir = target.join("artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
#[ignore = "needs chromium: run scripts/test, which installs it"]
fn the_status_pages_show_the_registered_service_and_a_live_call_rate() {
    let bin =
        locate_chromium(std::env::var_os("VOLLEY_CHROMIUM").map(PathBuf::from), std::env::var_os("PATH"))
            .unwrap_or_else(|e| panic!("{e}"));
    let browser = Browser { bin };

    let mut controller =
        Process::start(&["controller", "--listen", "tcp://127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    let registry = controller.wait_for(Duration::from_secs(60), "the controller's address", |l| {
        l.starts_with("tcp://").then(|| l.trim().to_string())
    });
    let controller_page = format!("http://{}/", controller.admin_address());

    let mut server = Process::start(&[
        "serve-echo",
        "--listen",
        "tcp://127.0.0.1:0",
        "--registry",
        &registry,
        "--name",
        SERVICE,
        "--admin",
        "127.0.0.1:0",
    ]);
    let served = server.wait_for(Duration::from_secs(60), "the server's address", |l| {
        let rest = l.strip_prefix(&format!("serving {SERVICE} on "))?;
        Some(rest.split(' ').next()?.to_string())
    });
    let server_page = format!("http://{}/", server.admin_address());

    // The controller's page lists the service, with the server's address as its instance.
    let row = format!("data-service=\"{SERVICE}\"");
    let address = served.trim_start_matches("tcp://").to_string();
    browser.poll(&controller_page, Duration::from_secs(60), "registered service", |dom| {
        (dom.contains(&row) && dom.contains(&address)).then_some(())
    });

    // Load through the registry: a few paced callers, so the machine is not flooded.
    let _load = Process::start(&[
        "bench",
        "--registry",
        &registry,
        "--service",
        SERVICE,
        "--concurrency",
        "4",
        "--pace-ms",
        "2",
        "--warmup",
        "0",
        "--duration",
        "600",
    ]);

    // The server's page shows a call rate above zero ...
    let (rate, calls) = browser.poll(&server_page, Duration::from_secs(90), "call rate above zero", |dom| {
        rate_and_calls(dom).filter(|(rate, _)| *rate > 0.0)
    });
    // ... and the script keeps it current: a later read shows another rate and more calls.
    let (later_rate, later_calls) =
        browser.poll(&server_page, Duration::from_secs(60), "changed call rate", |dom| {
            rate_and_calls(dom).filter(|(r, c)| *r > 0.0 && *r != rate && *c > calls)
        });
    println!(
        "{SERVICE}/echo: {rate} calls/s ({calls} calls), later {later_rate} calls/s ({later_calls} calls)"
    );

    // Both headers name their process, and both pages (the server's with its table and charts
    // filled in, the controller's with its registry) fit 800 px.
    check_header_and_width(&browser, &server_page, "server", &served);
    check_header_and_width(&browser, &controller_page, "controller", &registry);

    let dir = artifacts();
    browser.screenshot(&server_page, &dir.join("status-page.png"));
    browser.screenshot(&controller_page, &dir.join("status-page-controller.png"));
}

mod harness {
    use super::*;

    /// The page's cells are found by their row and column, and its numbers read as written.
    #[test]
    fn the_rate_and_calls_are_read_from_the_methods_row() {
        let dom = format!(
            "<tr data-side=\"client\" data-method=\"{SERVICE}/echo\"><td data-col=\"calls_per_s\">9</td>\
             <td data-col=\"calls\">9</td></tr>\
             <tr data-side=\"server\" data-method=\"{SERVICE}/echo\"><td class=\"l\" data-col=\"service\">x</td>\
             <td class=\"\" data-col=\"calls_per_s\">1,234.5</td><td class=\"\" data-col=\"calls\">56,789</td></tr>"
        );
        assert_eq!(rate_and_calls(&dom), Some((1234.5, 56789.0)));
        let nothing_yet = dom.replace("1,234.5", "–");
        assert_eq!(rate_and_calls(&nothing_yet), None);
        assert_eq!(rate_and_calls("<tr data-side=\"server\" data-method=\"other/echo\"></tr>"), None);
    }

    /// The header's fields and the noted widths are read from the DOM as the page writes them.
    #[test]
    fn the_header_and_widths_are_read_from_the_page() {
        let dom = "<html lang=\"en\" data-scroll-width=\"812\" data-client-width=\"800\"><body>\
            <h1><span id=\"role\" class=\"role\">server</span><span id=\"services\">echo</span></h1>\
            <span id=\"addresses\" class=\"addr\">tcp://127.0.0.1:5000</span><span id=\"version\">volley 0.1.0</span>\
            <span id=\"uptime\" class=\"\">up 3 s</span>";
        assert_eq!(header(dom), Some(["server", "tcp://127.0.0.1:5000", "volley 0.1.0", "up 3 s"]));
        assert_eq!(header(&dom.replace("up 3 s", "connecting…")), None);
        assert_eq!(widths(dom), Some((812, 800)));
        assert_eq!(widths("<html lang=\"en\">"), None);
    }

    /// Without Chromium the test fails with a message that names the fix; with one, it is found.
    #[test]
    fn a_missing_chromium_is_an_error_that_names_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let err = locate_chromium(None, Some(dir.path().into())).unwrap_err();
        assert!(err.contains("run scripts/test") && err.contains("apt-get install chromium"), "{err}");
        let err = locate_chromium(Some(dir.path().join("none")), Some(dir.path().into())).unwrap_err();
        assert!(err.contains("VOLLEY_CHROMIUM"), "{err}");
        let on_path = dir.path().join("chromium");
        std::fs::write(&on_path, "").unwrap();
        assert_eq!(locate_chromium(None, Some(dir.path().into())), Ok(on_path.clone()));
        let explicit = dir.path().join("chrome");
        std::fs::write(&explicit, "").unwrap();
        assert_eq!(locate_chromium(Some(explicit.clone()), Some(dir.path().into())), Ok(explicit));
    }

    /// Why a run may not leave the ignored test out: on CI (`CI=true`) it must run.
    fn ci_refusal(ci: Option<&str>, args: &[&str]) -> Option<String> {
        let runs_ignored = args.iter().any(|a| *a == "--include-ignored" || *a == "--ignored");
        (ci == Some("true") && !runs_ignored).then(|| {
            "CI=true, but this run leaves the browser test out (it is ignored by default): run \
             scripts/test, which installs chromium and passes --include-ignored"
                .to_string()
        })
    }

    /// On CI nothing is skipped: a `cargo test` without `--include-ignored` fails here.
    #[test]
    fn on_ci_a_run_without_the_browser_test_fails() {
        let args: Vec<String> = std::env::args().collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        if let Some(why) = ci_refusal(std::env::var("CI").ok().as_deref(), &args) {
            panic!("{why}");
        }
        assert!(ci_refusal(Some("true"), &["status_page"]).is_some());
        assert!(ci_refusal(Some("true"), &["status_page", "--include-ignored"]).is_none());
        assert!(ci_refusal(Some("true"), &["status_page", "--ignored"]).is_none());
        assert!(ci_refusal(None, &["status_page"]).is_none());
        assert!(ci_refusal(Some("false"), &["status_page"]).is_none());
    }
}
