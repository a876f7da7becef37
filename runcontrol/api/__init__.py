"""The HTTP front door: FastAPI routers, bearer-token auth, problem+json errors and SSE."""

from .app import create_app
from .auth import ALL_SCOPES, Caller, TokenVerifier, mint_dev_token

__all__ = ["ALL_SCOPES", "Caller", "TokenVerifier", "create_app", "mint_dev_token"]
