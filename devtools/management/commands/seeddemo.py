from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from accounts.models import Account
from accounts.selectors import api_key_authenticate
from accounts.services import account_create, account_user_create, api_key_create
from billing.services import credits_grant
from catalog.services import model_register
from core.commands import SpeedInferCommand
from core.credits import MICRO
from devtools import demo

DEMO_ACCOUNT = "demo"
DEMO_OWNER = "demo@example.com"
DEMO_MODEL = "acme/model-1"


class Command(SpeedInferCommand):
    help = (
        "Seed the embedded demo (idempotent): an admin user, a demo account with credits and a dashboard "
        "login, a demo model and a demo API key, printed on every run (kept under var/ for the demo only)."
    )

    def run(self, *args: Any, **options: Any) -> None:
        admin_password = os.environ.get("SPEEDINFER_ADMIN_PASSWORD", "admin")
        demo_password = os.environ.get("SPEEDINFER_DEMO_PASSWORD", "demo-password")
        user_model = get_user_model()
        with transaction.atomic():
            if not user_model.objects.filter(username="admin").exists():
                user_model.objects.create_superuser("admin", "admin@example.com", admin_password)
            model_register(
                model_id=DEMO_MODEL,
                input_price=MICRO // 2,
                output_price=MICRO * 3 // 2,
                max_output_tokens=512,
                kind="chat",
            )
            account = Account.objects.filter(name=DEMO_ACCOUNT).first()
            if account is None:
                account = account_create(name=DEMO_ACCOUNT)
                account_user_create(account=account, email=DEMO_OWNER, password=demo_password)
        if account.available < 10 * MICRO:
            credits_grant(account=account, amount=100 * MICRO, actor="seeddemo", note="demo credits")
        self._seed_workers()
        secret = self._demo_key(account)
        self.stdout.write(
            f"Admin:     http://127.0.0.1:{os.environ.get('PORT', '8000')}/admin/  admin / {admin_password}"
        )
        self.stdout.write(
            f"Dashboard: http://127.0.0.1:{os.environ.get('PORT', '8000')}/dashboard/  {DEMO_OWNER} / {demo_password}"
        )
        self.stdout.write(f"Demo API key (model {DEMO_MODEL}):")
        self.stdout.write(secret)

    def _seed_workers(self) -> None:
        """Register the demo workers; filled in by the workers/proxy issues."""
        demo.seed_workers()

    def _demo_key(self, account: Account) -> str:
        # The demo's key is printed on every `make run`, so the embedded demo keeps
        # its secret in var/. Production keys are never stored.
        path = Path(settings.VAR_DIR) / "demo_api_key"
        if path.exists():
            secret = path.read_text().strip()
            key = api_key_authenticate(raw_key=secret).key
            # A demo key made before the embeddings scope existed is replaced, so the README's examples work.
            if key is not None and "embeddings" in key.scopes:
                return secret
        created = api_key_create(account=account, name="demo", rpm=600, tpm=1_000_000)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(created.secret)
        path.chmod(0o600)
        return created.secret
