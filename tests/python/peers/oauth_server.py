"""An OAuth 2.1 authorization server and the MCP server it protects, in one
process, for tests/python/test_oauth_login.py: the official Python SDK's
(PyPI `mcp`) streamable HTTP server and authorization-server routes on
127.0.0.1:PORT, with a provider of ours that approves at once.

- /.well-known/oauth-protected-resource/mcp (RFC 9728), the authorization
  server's metadata (RFC 8414), /register (RFC 7591), /authorize (answers
  the redirect back to the client with a code at once: the person's
  approval), /token (the SDK checks PKCE S256 and the redirect URI; the
  codes, access and refresh tokens are ours), /revoke (RFC 7009).
- /mcp answers 401 with `WWW-Authenticate: Bearer ... resource_metadata=`
  without a valid, unexpired, unrevoked access token issued for it.
- Tokens are random (`at-`/`rt-` and 40 hex digits), access tokens expire
  after EXPIRES_IN seconds; a refresh rotates the refresh token (the old
  one is revoked), as OAuth 2.1 asks of public clients.
- GET /test/state: what happened, for the test only (every token issued,
  the refresh grants, the revocations, each MCP request's token).
  Nothing is printed and nothing is written to disk.

usage: oauth_server.py PORT EXPIRES_IN"""

import secrets
import sys
import time

import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
import mcp.server.auth.handlers.revoke as revoke_handler
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from starlette.requests import Request
from starlette.responses import JSONResponse



class RevocationRequest(revoke_handler.RevocationRequest):
    """The SDK's (2.3) requires a `client_secret` field even of a public
    client, which authenticates with its `client_id` alone (RFC 7009 2.1,
    RFC 6749 2.3): absent, it is none."""

    client_secret: str | None = None


revoke_handler.RevocationRequest = RevocationRequest

PORT, EXPIRES_IN = int(sys.argv[1]), int(sys.argv[2])
BASE = f"http://127.0.0.1:{PORT}"
RESOURCE = f"{BASE}/mcp"


class Provider:
    """Clients, codes and tokens in memory; every token recorded."""

    def __init__(self):
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.revoked: set[str] = set()
        # Every token issued, in order: {kind, token, generation, issued_at, expires_at}.
        self.issued: list[dict] = []
        # Each refresh grant: the refresh token's generation and when.
        self.refreshes: list[dict] = []
        self.revocations: list[dict] = []
        self.authorizations = 0
        self.generation_of: dict[str, int] = {}

    async def get_client(self, client_id):
        return self.clients.get(client_id)

    async def register_client(self, client_info):
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client, params: AuthorizationParams) -> str:
        # The person approves at once: straight back to the client.
        self.authorizations += 1
        code = "code-" + secrets.token_hex(20)
        self.codes[code] = AuthorizationCode(
            code=code, scopes=params.scopes or [], expires_at=time.time() + 300, client_id=client.client_id,
            code_challenge=params.code_challenge, redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly, resource=params.resource)
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client, authorization_code):
        code = self.codes.get(authorization_code)
        return code if code and code.client_id == client.client_id else None

    def _issue(self, client_id, scopes, resource, generation) -> OAuthToken:
        now = int(time.time())
        access = "at-" + secrets.token_hex(20)
        refresh = "rt-" + secrets.token_hex(20)
        self.access[access] = AccessToken(token=access, client_id=client_id, scopes=scopes,
                                          expires_at=now + EXPIRES_IN, resource=resource)
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        for kind, token, expires in [("access", access, now + EXPIRES_IN), ("refresh", refresh, None)]:
            self.generation_of[token] = generation
            self.issued.append({"kind": kind, "token": token, "generation": generation, "issued_at": time.time(),
                                "expires_at": expires})
        return OAuthToken(access_token=access, token_type="Bearer", expires_in=EXPIRES_IN, refresh_token=refresh,
                          scope=" ".join(scopes) or None)

    async def exchange_authorization_code(self, client, authorization_code):
        del self.codes[authorization_code.code]
        generation = 1 + max((t["generation"] for t in self.issued), default=-1)
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource, generation)

    async def load_refresh_token(self, client, refresh_token):
        token = self.refresh.get(refresh_token)
        if token is None or refresh_token in self.revoked or token.client_id != client.client_id:
            return None
        return token

    async def exchange_refresh_token(self, client, refresh_token, scopes):
        if refresh_token.token in self.revoked:
            raise TokenError(error="invalid_grant", error_description="refresh token revoked")
        # Rotation: the refresh token is used once.
        self.revoked.add(refresh_token.token)
        old = self.generation_of[refresh_token.token]
        generation = 1 + max(t["generation"] for t in self.issued)
        self.refreshes.append({"from_generation": old, "to_generation": generation, "at": time.time()})
        return self._issue(client.client_id, scopes or refresh_token.scopes, refresh_token.resource, generation)

    async def load_access_token(self, token):
        found = self.access.get(token)
        if found is None or token in self.revoked:
            return None
        return found

    async def revoke_token(self, token):
        self.revoked.add(token.token)
        kind = "access" if isinstance(token, AccessToken) else "refresh"
        self.revocations.append({"kind": kind, "generation": self.generation_of.get(token.token), "at": time.time()})


provider = Provider()
requests: list[dict] = []

server = MCPServer(
    "oauth-test",
    auth_server_provider=provider,
    auth=AuthSettings(
        issuer_url=BASE,
        resource_server_url=RESOURCE,
        validate_token_resource=True,
        client_registration_options=ClientRegistrationOptions(enabled=True),
        revocation_options=RevocationOptions(enabled=True),
    ),
)


@server.tool()
def whoami() -> str:
    """Says which of the server's access tokens the request carried (its generation, not its value)."""
    token = get_access_token()
    if token is None:
        return "generation=unknown"
    return f"generation={provider.generation_of.get(token.token)}"


@server.custom_route("/test/state", methods=["GET"])
async def state(request: Request) -> JSONResponse:
    return JSONResponse({"issued": provider.issued, "refreshes": provider.refreshes,
                         "revocations": provider.revocations, "authorizations": provider.authorizations,
                         "clients": len(provider.clients), "requests": requests})


def recording(app):
    """Notes each request to /mcp: when, and which token it carried (its
    generation; `none`, `unknown`, or also `expired`/`revoked`)."""
    async def wrapper(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            header = dict(scope["headers"]).get(b"authorization", b"").decode()
            token = header.removeprefix("Bearer ").strip()
            entry = {"at": time.time(), "method": scope["method"], "status": None}
            if not token:
                entry["generation"] = "none"
            else:
                entry["generation"] = provider.generation_of.get(token, "unknown")
                known = provider.access.get(token)
                entry["expired"] = bool(known and known.expires_at < time.time())
                entry["revoked"] = token in provider.revoked
            requests.append(entry)

            async def noting(message):
                if message["type"] == "http.response.start":
                    entry["status"] = message["status"]
                await send(message)
            return await app(scope, receive, noting)
        return await app(scope, receive, send)
    return wrapper


if __name__ == "__main__":
    uvicorn.run(recording(server.streamable_http_app()), host="127.0.0.1", port=PORT, log_level="warning")
