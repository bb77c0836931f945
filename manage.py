#!/usr/bin/env python
"""Django's command-line utility for SpeedInfer."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "speedinfer.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        # Settings load here; a missing SECRET_KEY or ALLOWED_HOSTS is one line, not a traceback.
        from django.conf import settings

        settings.INSTALLED_APPS  # noqa: B018
    except ImproperlyConfigured as exc:
        sys.stderr.write(f"speedinfer: {exc}\n")
        sys.exit(1)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
