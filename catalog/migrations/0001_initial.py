# PublicModel moved here from billing. Its table (billing_publicmodel) was created by billing/0001 and
# keeps its name, so this only takes the model into catalog's state; billing/0003 drops it from billing's.

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('billing', '0002_usage_indexes'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='PublicModel',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('model_id', models.CharField(max_length=200, unique=True)),
                        ('input_price', models.BigIntegerField(help_text='micro-credits per 1,000,000 prompt tokens')),
                        ('output_price', models.BigIntegerField(help_text='micro-credits per 1,000,000 completion tokens')),
                        ('max_output_tokens', models.PositiveIntegerField(default=4096)),
                        ('enabled', models.BooleanField(default=True)),
                        ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                    ],
                    options={
                        'verbose_name': 'model',
                        'ordering': ['model_id'],
                        'db_table': 'billing_publicmodel',
                        'constraints': [models.CheckConstraint(condition=models.Q(('input_price__gte', 0)), name='model_input_price_non_negative'), models.CheckConstraint(condition=models.Q(('output_price__gte', 0)), name='model_output_price_non_negative')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
