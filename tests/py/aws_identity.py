"""Where AWS code running on an instance or in a pod gets its keys, for the tests only.

    aws_identity.py imds PORT KEY_ID SECRET        an EC2 instance metadata service (IMDSv2:
                                                   a session token first, then the role's
                                                   credentials)
    aws_identity.py sts PORT KEY_ID SECRET TOKEN   an STS endpoint over HTTPS (a certificate
                                                   made here; the client is told to accept
                                                   it) answering AssumeRoleWithWebIdentity
                                                   for the web identity token TOKEN only
"""
import datetime
import http.server
import json
import ssl
import sys
import tempfile
import urllib.parse

MODE, PORT, KEY_ID, SECRET = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ROLE = "shardfs-test-role"
PREFIX = "/latest/meta-data/iam/security-credentials/"


def expires():
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, body, status=200):
        body = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        if MODE == "imds" and self.path == "/latest/api/token":
            return self.answer("imds-session-token")
        self.answer("", 404)

    def do_GET(self):
        if MODE != "imds" or self.headers.get("X-aws-ec2-metadata-token") != "imds-session-token":
            return self.answer("", 401)
        if self.path == PREFIX:
            return self.answer(ROLE)
        if self.path == PREFIX + ROLE:
            return self.answer(json.dumps({
                "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": KEY_ID,
                "SecretAccessKey": SECRET, "Token": "imds-session", "Expiration": expires()}))
        self.answer("", 404)

    def do_POST(self):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        n = int(self.headers.get("Content-Length") or 0)
        query.update(urllib.parse.parse_qs(self.rfile.read(n).decode()))
        ok = (MODE == "sts" and query.get("Action") == ["AssumeRoleWithWebIdentity"]
              and query.get("WebIdentityToken") == [sys.argv[5]])
        if not ok:
            return self.answer("<Error><Code>AccessDenied</Code></Error>", 403)
        self.answer(
            '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
            "<AssumeRoleWithWebIdentityResult><Credentials>"
            f"<AccessKeyId>{KEY_ID}</AccessKeyId><SecretAccessKey>{SECRET}</SecretAccessKey>"
            f"<SessionToken>web-identity-session</SessionToken><Expiration>{expires()}</Expiration>"
            "</Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>")


def self_signed():
    """A certificate for 127.0.0.1 and its key, as PEM files in a temporary directory."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    import ipaddress
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(key, hashes.SHA256()))
    d = tempfile.mkdtemp()
    with open(f"{d}/cert.pem", "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(f"{d}/key.pem", "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return f"{d}/cert.pem", f"{d}/key.pem"


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
if MODE == "sts":
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*self_signed())
    server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
