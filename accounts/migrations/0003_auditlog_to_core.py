# AuditLog now lives in the core app (same table): drop it from accounts' state only.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0002_auditlog'),
        ('core', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='AuditLog')],
            database_operations=[],
        ),
    ]
