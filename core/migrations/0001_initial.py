# AuditLog moved here from accounts. Its table (accounts_auditlog) was created by accounts/0002 and
# keeps its name, so this only takes the model into core's state; accounts/0003 drops it from accounts'.

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('accounts', '0002_auditlog'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='AuditLog',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('created_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                        ('actor', models.CharField(help_text="staff username, 'apikey:<prefix>' or a command name", max_length=150)),
                        ('action', models.CharField(db_index=True, help_text='e.g. key.create, credits.grant', max_length=64)),
                        ('target_type', models.CharField(blank=True, max_length=64)),
                        ('target_id', models.CharField(blank=True, max_length=200)),
                        ('target_repr', models.CharField(blank=True, max_length=300)),
                        ('detail', models.JSONField(blank=True, default=dict)),
                    ],
                    options={
                        'verbose_name': 'audit log entry',
                        'verbose_name_plural': 'audit log',
                        'ordering': ['-created_at', '-id'],
                        'db_table': 'accounts_auditlog',
                        'indexes': [models.Index(fields=['target_type', 'target_id'], name='accounts_au_target__0c7dca_idx')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
