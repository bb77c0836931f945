# An account's available balance never goes below zero, enforced by the database too.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0004_account_ceilings'),
    ]

    operations = [
        migrations.AddConstraint(
            model_name='account',
            constraint=models.CheckConstraint(condition=models.Q(('available__gte', 0)), name='account_available_non_negative'),
        ),
    ]
