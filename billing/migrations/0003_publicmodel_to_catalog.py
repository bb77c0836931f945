# PublicModel now lives in the catalog app (same table): drop it from billing's state only.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0002_usage_indexes'),
        ('catalog', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='PublicModel')],
            database_operations=[],
        ),
    ]
