# A running request's reservation has a lease the gateway renews; the sweeper respects it.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('billing', '0004_usage_uncharged'),
    ]

    operations = [
        migrations.AddField(
            model_name='reservation',
            name='lease_until',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
