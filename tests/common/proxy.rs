//! An HTTP proxy in front of a test's object-store server that can misbehave the way a
//! cloud's front end does: answer 503 SlowDown or 429 instead of the server, stall a
//! request, reset a connection in the middle of an upload, let a request land and lose its
//! answer, hold one back, or be gone altogether. It also logs every request it passed
//! (method, path, status), which is how tests count the PUTs a mount made.
//!
//! One request per connection: the request going to the server and the answer going back
//! both say `Connection: close`, so the proxy never has to find where an answer ends, and
//! a client never reuses a connection the proxy closed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to a request that a rule matches.
pub enum Fault {
    /// Answers with this status (and an S3/GCS/Azure-shaped error body) in the server's
    /// place: the request never reaches it.
    Status(u16),
    /// Waits this long before passing the request on.
    Stall(Duration),
    /// Passes the head and half of the body on, then cuts both connections.
    ResetMidRequest,
    /// Passes the request on and lets the server answer, then cuts the client off
    /// without the answer: the request took effect, the client cannot know.
    LoseAnswer,
    /// Signals `seen`, then waits for `release` before passing the request on.
    Hold(Sender<()>, Receiver<()>),
}

struct Rule {
    method: String,
    suffix: String,
    times: usize,
    fault: Arc<Mutex<Fault>>,
}

/// A request the proxy saw: what it asked (its target decoded), and the status the client
/// got (`None`: no answer reached it).
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub status: Option<u16>,
    /// Its `Authorization` header, if any (which credentials signed it).
    pub auth: Option<String>,
}

#[derive(Default)]
struct State {
    down: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
    rules: Mutex<Vec<Rule>>,
    log: Mutex<Vec<Seen>>,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
}

impl Proxy {
    /// A proxy on a free port of 127.0.0.1 in front of the server at 127.0.0.1:`target`.
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        let s = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if s.down.load(SeqCst) {
                    continue; // dropped: the client sees the connection closed
                }
                let s = s.clone();
                std::thread::spawn(move || serve(client, target, &s));
            }
        });
        Proxy { port, state }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The next `times` requests of `method` ("" for any) whose path (decoded, without
    /// its query) ends with `suffix` meet `fault`.
    pub fn fault(&self, method: &str, suffix: &str, times: usize, fault: Fault) {
        self.state.rules.lock().unwrap().push(Rule {
            method: method.to_string(),
            suffix: suffix.to_string(),
            times,
            fault: Arc::new(Mutex::new(fault)),
        });
    }

    /// Holds back, once, the first request of `method` whose path ends with `suffix`. The
    /// returned receiver signals that it arrived; sending on the returned sender lets it
    /// through.
    pub fn hold_once(&self, method: &str, suffix: &str) -> (Receiver<()>, Sender<()>) {
        let (seen_tx, seen_rx) = channel();
        let (release_tx, release_rx) = channel();
        self.fault(method, suffix, 1, Fault::Hold(seen_tx, release_rx));
        (seen_rx, release_tx)
    }

    /// Takes the server away (open connections are cut, new ones closed at once) or
    /// brings it back.
    pub fn set_down(&self, down: bool) {
        self.state.down.store(down, SeqCst);
        if down {
            for s in self.state.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    /// Every request passed on or answered so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.state.log.lock().unwrap().clone()
    }

    /// How many requests of `method` had a path that ends with `suffix` and got a 2xx.
    pub fn succeeded(&self, method: &str, suffix: &str) -> usize {
        self.requests()
            .iter()
            .filter(|s| s.method == method && path_only(&s.path).ends_with(suffix))
            .filter(|s| s.status.is_some_and(|c| (200..300).contains(&c)))
            .count()
    }
}

/// The path of a request target, without its query.
pub fn path_only(target: &str) -> &str {
    target.split('?').next().unwrap_or_default()
}

/// A request target with its percent-escapes decoded (GCS's client escapes every `/` of
/// a key), so that rules and counts name keys as they are.
fn decoded(target: &str) -> String {
    super::mount::url_decoded(target)
}

/// A request as read from the client: its head's lines and its body.
struct Request {
    method: String,
    target: String,
    /// `target`, decoded.
    path: String,
    headers: Vec<String>,
    body: Vec<u8>,
}

fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end().to_string();
        if h.is_empty() {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
            continue;
        }
        if !lower.starts_with("connection:") {
            headers.push(h);
        }
    }
    let body = if chunked {
        let body = read_chunked(reader)?;
        headers.push(format!("Content-Length: {}", body.len()));
        body
    } else {
        let mut body = vec![0u8; length];
        reader.read_exact(&mut body).ok()?;
        body
    };
    Some(Request {
        method,
        path: decoded(&target),
        target,
        headers,
        body,
    })
}

fn read_chunked(reader: &mut BufReader<TcpStream>) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size).ok()?;
        let n = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
        let mut chunk = vec![0u8; n + 2];
        reader.read_exact(&mut chunk).ok()?;
        body.extend_from_slice(&chunk[..n]);
        if n == 0 {
            return Some(body);
        }
    }
}

impl Request {
    fn head(&self) -> Vec<u8> {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.target);
        for h in &self.headers {
            head.push_str(h);
            head.push_str("\r\n");
        }
        head.push_str("Connection: close\r\n\r\n");
        head.into_bytes()
    }
}

/// The rule matching `req`, used up by one.
fn matching(state: &State, req: &Request) -> Option<Arc<Mutex<Fault>>> {
    let mut rules = state.rules.lock().unwrap();
    let i = rules.iter().position(|r| {
        r.times > 0
            && (r.method.is_empty() || r.method == req.method)
            && path_only(&req.path).ends_with(&r.suffix)
    })?;
    rules[i].times -= 1;
    let fault = rules[i].fault.clone();
    if rules[i].times == 0 {
        rules.remove(i);
    }
    Some(fault)
}

/// An error body each provider's client reads as what it is (throttled, unavailable).
fn error_answer(status: u16) -> Vec<u8> {
    let code = match status {
        503 => "SlowDown",
        429 => "TooManyRequests",
        _ => "InternalError",
    };
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code}</Code>\
         <Message>injected by the test proxy</Message></Error>"
    );
    format!(
        "HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\nRetry-After: 0\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn serve(client: TcpStream, target: u16, state: &State) {
    let Ok(reading) = client.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(reading);
    let Some(req) = read_request(&mut reader) else {
        return;
    };
    let auth = req.headers.iter().find_map(|h| {
        let (name, value) = h.split_once(':')?;
        name.eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_string())
    });
    let mut seen = Seen {
        method: req.method.clone(),
        path: req.path.clone(),
        status: None,
        auth,
    };
    let status = pass(client, target, state, &req);
    seen.status = status;
    state.log.lock().unwrap().push(seen);
}

/// Passes `req` on (or not, as a rule says); returns the status the client got.
fn pass(mut client: TcpStream, target: u16, state: &State, req: &Request) -> Option<u16> {
    let fault = matching(state, req);
    let mut lose_answer = false;
    let mut reset = false;
    let mut stall = None;
    if let Some(f) = &fault {
        match &*f.lock().unwrap() {
            Fault::Status(code) => {
                let _ = client.write_all(&error_answer(*code));
                let _ = client.shutdown(Shutdown::Both);
                return Some(*code);
            }
            // Slept after the rule is let go: stalled requests run side by side.
            Fault::Stall(d) => stall = Some(*d),
            Fault::ResetMidRequest => reset = true,
            Fault::LoseAnswer => lose_answer = true,
            Fault::Hold(seen, release) => {
                let _ = seen.send(());
                let _ = release.recv();
            }
        }
    }
    if let Some(d) = stall {
        std::thread::sleep(d);
    }
    if state.down.load(SeqCst) {
        let _ = client.shutdown(Shutdown::Both);
        return None;
    }
    let mut server = TcpStream::connect(("127.0.0.1", target)).ok()?;
    {
        let mut open = state.open.lock().unwrap();
        open.push(client.try_clone().ok()?);
        open.push(server.try_clone().ok()?);
    }
    server.write_all(&req.head()).ok()?;
    if reset {
        let _ = server.write_all(&req.body[..req.body.len() / 2]);
        let _ = server.shutdown(Shutdown::Both);
        let _ = client.shutdown(Shutdown::Both);
        return None;
    }
    server.write_all(&req.body).ok()?;
    let mut answer = Vec::new();
    let _ = server.read_to_end(&mut answer);
    let status = std::str::from_utf8(answer.get(9..12)?).ok()?.parse().ok();
    if lose_answer {
        let _ = client.shutdown(Shutdown::Both);
        return None;
    }
    client.write_all(&closing(answer)).ok()?;
    let _ = client.shutdown(Shutdown::Both);
    status
}

/// `answer` with `Connection: close` in its head, whatever it said.
fn closing(answer: Vec<u8>) -> Vec<u8> {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return answer;
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let mut out: String = head
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    out.push_str("Connection: close\r\n\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(&answer[end + 4..]);
    out
}
