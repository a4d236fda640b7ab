# Captures the PATCH bodies that a real kubectl sends, for svcnet-apimachinery's fixtures.
#
# A tiny HTTP API server: discovery for services and deployments, GET of the objects given in
# STATE (a JSON file mapping request paths to live objects), and PATCH requests written to OUT.
# Usage (how the *.patch.json files here were made, with kubectl 1.33):
#   python3 capture-kubectl-patch.py 18099 state.json out/ &
#   KUBECONFIG=<kubeconfig with server http://127.0.0.1:18099> kubectl.1.33 apply --validate=false -f <manifest>
# state.json = {"/api/v1/namespaces/default/services/myapp": <service-live.json>,
#               "/apis/apps/v1/namespaces/default/deployments/web": <deployment-live.json>}
# The manifests applied are service-manifest.json and deployment-manifest.json.
import json, sys, http.server, socketserver, os
STATE = json.load(open(sys.argv[2]))  # {path: object}
OUT = sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code); self.send_header("Content-Type","application/json")
        self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
    def do_GET(self):
        p = self.path.split("?")[0]
        if p == "/api": return self._send(200, {"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"127.0.0.1"}]})
        if p == "/apis": return self._send(200, {"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"apps","versions":[{"groupVersion":"apps/v1","version":"v1"}],"preferredVersion":{"groupVersion":"apps/v1","version":"v1"}}]})
        if p == "/api/v1": return self._send(200, {"kind":"APIResourceList","groupVersion":"v1","resources":[
            {"name":"services","singularName":"service","namespaced":True,"kind":"Service","verbs":["create","delete","get","list","patch","update","watch"]},
            {"name":"pods","singularName":"pod","namespaced":True,"kind":"Pod","verbs":["create","delete","get","list","patch","update","watch"]}]})
        if p == "/apis/apps/v1": return self._send(200, {"kind":"APIResourceList","groupVersion":"apps/v1","resources":[
            {"name":"deployments","singularName":"deployment","namespaced":True,"kind":"Deployment","verbs":["create","delete","get","list","patch","update","watch"]}]})
        if p in STATE: return self._send(200, STATE[p])
        self._send(404, {"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"not found"})
    def do_PATCH(self):
        n = int(self.headers.get("Content-Length", 0)); body = self.rfile.read(n)
        p = self.path.split("?")[0]
        with open(os.path.join(OUT, p.strip("/").replace("/", "_") + ".patch.json"), "wb") as f: f.write(body)
        with open(os.path.join(OUT, p.strip("/").replace("/", "_") + ".ctype"), "w") as f: f.write(self.headers.get("Content-Type",""))
        self._send(200, STATE[p])
class S(socketserver.ThreadingMixIn, http.server.HTTPServer): daemon_threads = True
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
