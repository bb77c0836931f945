from __future__ import annotations

from typing import Any

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


def existing_logins_are_owners(apps: Any, schema_editor: Any) -> None:
    # Before teams, every dashboard login was its account's one owner (createaccount --owner).
    apps.get_model("accounts", "Membership").objects.update(role="owner")


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0006_key_budget"),
    ]

    operations = [
        migrations.AddField(
            model_name="membership",
            name="role",
            field=models.CharField(
                choices=[("owner", "Owner"), ("developer", "Developer"), ("viewer", "Viewer")],
                default="viewer",
                max_length=16,
            ),
        ),
        migrations.AlterModelOptions(name="membership", options={"ordering": ["created_at", "pk"]}),
        migrations.RunPython(existing_logins_are_owners, migrations.RunPython.noop),
        migrations.CreateModel(
            name="Invitation",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("email", models.EmailField(max_length=254)),
                (
                    "role",
                    models.CharField(
                        choices=[("owner", "Owner"), ("developer", "Developer"), ("viewer", "Viewer")],
                        default="viewer",
                        max_length=16,
                    ),
                ),
                ("nonce_digest", models.CharField(max_length=64, unique=True)),
                ("invited_by", models.CharField(blank=True, max_length=150)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("expires_at", models.DateTimeField()),
                ("accepted_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                (
                    "account",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="invitations",
                        to="accounts.account",
                    ),
                ),
            ],
            options={"ordering": ["-created_at"]},
        ),
    ]
